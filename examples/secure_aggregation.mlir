// Secure aggregation: every rank holds a CKKS ciphertext ([2 polynomials, 3 RNS limbs, 8192 coefficients])
// and the group needs their homomorphic sum. SEAL's 60-bit primes: max_modulus_bits 60.
// The secret key stays with the data owner, outside the group: ranks see one another's
// ciphertexts during the sum (all of them in gather-fold), so no rank may hold it.
// Run: python examples/secure_aggregation.py    (or distir-opt -p lower-ciphertext-add examples/secure_aggregation.mlir)
func.func @main(%ct: tensor<2x3x8192xi64>, %moduli: tensor<3xi64>) -> tensor<2x3x8192xi64> {
  %sum = dist.all_reduce_add_ciphertext %ct, %moduli max_modulus_bits 60 : tensor<2x3x8192xi64>, tensor<3xi64>
  func.return %sum : tensor<2x3x8192xi64>
}
