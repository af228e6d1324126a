// RUN: distir-opt %s -p 'defer-modular-reduction{max-group-size=3}' | filecheck %s
// RUN: distir-opt %s -p 'defer-modular-reduction{max-group-size=3 remarks=true}' 2>&1 >/dev/null | filecheck %s --check-prefix=REMARK

// Deferred when P * (q_max - 1) <= 2^63 - 1 is proved: a native int64 sum,
// then one remainder by the broadcast moduli, keeping the op's checks (limbs
// reduced; moduli equal on every rank unless constant). Otherwise kept, with
// a remark.

dist.group @pair [[0, 1], [2, 3]]

// P = 2 from @pair, q_max - 1 = 2^62 - 1: 2 * (2^62 - 1) = 2^63 - 2 fits.
func.func @constant_moduli(%ct: tensor<4x8xi64>) -> tensor<4x8xi64> {
  %q = arith.constant dense<[4611686018427387904, 3, 5, 7]> : tensor<4xi64>
  %y = dist.all_reduce_add_ciphertext %ct, %q group @pair : tensor<4x8xi64>, tensor<4xi64>
  func.return %y : tensor<4x8xi64>
}
// REMARK: remark: {{.*}}defer_modular_reduction.mlir:[[# @LINE - 3]]:3: 'dist.all_reduce_add_ciphertext' deferred to a native sum and one remainder: P*(q_max-1) = 9223372036854775806 <= 2^63-1 (P=2 from group @pair, q_max=4611686018427387904 from constant moduli)

// CHECK-LABEL: func.func @constant_moduli(%ct: tensor<4x8xi64>) -> tensor<4x8xi64> {
// CHECK-NEXT:    %q = arith.constant dense<[4611686018427387904, 3, 5, 7]> : tensor<4xi64>
// CHECK-NEXT:    dist.assert_reduced %ct, %q : tensor<4x8xi64>, tensor<4xi64>
// CHECK-NEXT:    %empty = tensor.empty() : tensor<4x8xi64>
// CHECK-NEXT:    %q_bcast = linalg.broadcast ins(%q:tensor<4xi64>) outs(%empty:tensor<4x8xi64>) dimensions = [1]
// CHECK-NEXT:    %sum = dist.all_reduce sum %ct group @pair : tensor<4x8xi64>
// CHECK-NEXT:    %y = arith.remui %sum, %q_bcast : tensor<4x8xi64>
// CHECK-NEXT:    func.return %y : tensor<4x8xi64>
// CHECK-NEXT:  }

// One past the bound: kept.
func.func @one_past(%ct: tensor<4x8xi64>) -> tensor<4x8xi64> {
  %q = arith.constant dense<[4611686018427387905, 3, 5, 7]> : tensor<4xi64>
  %y = dist.all_reduce_add_ciphertext %ct, %q group @pair : tensor<4x8xi64>, tensor<4xi64>
  func.return %y : tensor<4x8xi64>
}
// REMARK-NEXT: remark: {{.*}}defer_modular_reduction.mlir:[[# @LINE - 3]]:3: 'dist.all_reduce_add_ciphertext' kept: P*(q_max-1) = 9223372036854775808 exceeds 2^63-1 (P=2 from group @pair, q_max=4611686018427387905 from constant moduli)

// CHECK-LABEL: func.func @one_past
// CHECK:         %y = dist.all_reduce_add_ciphertext %ct, %q group @pair : tensor<4x8xi64>, tensor<4xi64>

// World group: P <= 3 from the option; q <= 2^60 - 1.
func.func @declared_bits(%ct: tensor<4x8xi64>, %q: tensor<4xi64>) -> tensor<4x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits 60 : tensor<4x8xi64>, tensor<4xi64>
  func.return %y : tensor<4x8xi64>
}
// REMARK-NEXT: remark: {{.*}}:[[# @LINE - 3]]:3: 'dist.all_reduce_add_ciphertext' deferred to a native sum and one remainder: P*(q_max-1) = 3458764513820540922 <= 2^63-1 (P<=3 from max-group-size, q_max<=2^60-1 from max_modulus_bits 60)

// CHECK-LABEL: func.func @declared_bits
// CHECK-NEXT:    dist.assert_reduced %ct, %q max_modulus_bits 60 : tensor<4x8xi64>, tensor<4xi64>
// CHECK-NEXT:    dist.assert_uniform %q : tensor<4xi64>
// CHECK:         %sum = dist.all_reduce sum %ct {assumed_max_group_size = 3 : i64} : tensor<4x8xi64>
// CHECK-NEXT:    %y = arith.remui %sum, %q_bcast : tensor<4x8xi64>

// Nothing is known about the moduli: kept.
func.func @unknown_moduli(%ct: tensor<4x8xi64>, %q: tensor<4xi64>) -> tensor<4x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q group @pair : tensor<4x8xi64>, tensor<4xi64>
  func.return %y : tensor<4x8xi64>
}
// REMARK-NEXT: remark: {{.*}}:[[# @LINE - 3]]:3: 'dist.all_reduce_add_ciphertext' kept: moduli unknown (constant moduli or max_modulus_bits needed)

// CHECK-LABEL: func.func @unknown_moduli
// CHECK:         %y = dist.all_reduce_add_ciphertext %ct, %q group @pair
