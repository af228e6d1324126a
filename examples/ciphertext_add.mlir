// Homomorphic sum of RNS ciphertexts: 2 polynomials x 3 limbs x 16 coefficients, one modulus per limb. Run: distir-opt examples/ciphertext_add.mlir -p lower-ciphertext-add
builtin.module {
  func.func @main(%ct: tensor<2x3x16xi64>, %moduli: tensor<3xi64>) -> tensor<2x3x16xi64> {
    %sum = dist.all_reduce_add_ciphertext %ct, %moduli max_modulus_bits 60 : tensor<2x3x16xi64>, tensor<3xi64>
    func.return %sum : tensor<2x3x16xi64>
  }
}
