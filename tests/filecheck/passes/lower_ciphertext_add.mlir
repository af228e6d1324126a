// RUN: distir-opt %s -p lower-ciphertext-add | filecheck %s
// RUN: distir-opt %s -p lower-ciphertext-add,lower-ciphertext-add | filecheck %s

// The ciphertext all-reduce becomes a commutative generic all-reduce that
// keeps the op's limb check (dist.assert_reduced) and records its combine
// (known_combine): the moduli [L] are the extra operand, broadcast to the
// ciphertext's shape inside the region; the region adds, subtracts q, and
// adds q back where the difference is negative.

dist.group @tp [[0, 1], [2, 3]]

func.func @static(%ct: tensor<2x4x8xi64>, %q: tensor<4xi64>) -> tensor<2x4x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q group @tp : tensor<2x4x8xi64>, tensor<4xi64>
  func.return %y : tensor<2x4x8xi64>
}

// CHECK-LABEL: func.func @static(%ct: tensor<2x4x8xi64>, %q: tensor<4xi64>) -> tensor<2x4x8xi64> {
// CHECK-NEXT:    dist.assert_reduced %ct, %q : tensor<2x4x8xi64>, tensor<4xi64>
// CHECK-NEXT:    %y = dist.all_reduce %ct, %q group @tp commutative {known_combine = "modular-add"} : tensor<2x4x8xi64>, tensor<4xi64> combine(%lhs, %rhs, %q_limbs) {
// CHECK-NEXT:      %empty = tensor.empty() : tensor<2x4x8xi64>
// CHECK-NEXT:      %mod = linalg.broadcast ins(%q_limbs:tensor<4xi64>) outs(%empty:tensor<2x4x8xi64>) dimensions = [0, 2]
// CHECK-NEXT:      %sum = arith.addi %lhs, %rhs : tensor<2x4x8xi64>
// CHECK-NEXT:      %sum_minus_q = arith.subi %sum, %mod : tensor<2x4x8xi64>
// CHECK-NEXT:      %c63 = arith.constant dense<63> : tensor<2x4x8xi64>
// CHECK-NEXT:      %below_q = arith.shrsi %sum_minus_q, %c63 : tensor<2x4x8xi64>
// CHECK-NEXT:      %add_back = arith.andi %below_q, %mod : tensor<2x4x8xi64>
// CHECK-NEXT:      %reduced = arith.addi %sum_minus_q, %add_back : tensor<2x4x8xi64>
// CHECK-NEXT:      dist.yield %reduced : tensor<2x4x8xi64>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %y : tensor<2x4x8xi64>
// CHECK-NEXT:  }

func.func @dynamic(%ct: tensor<?x?x8xi64>, %q: tensor<4xi64>) -> tensor<?x?x8xi64> {
  %y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits 50 : tensor<?x?x8xi64>, tensor<4xi64>
  func.return %y : tensor<?x?x8xi64>
}

// CHECK-LABEL: func.func @dynamic(%ct: tensor<?x?x8xi64>, %q: tensor<4xi64>) -> tensor<?x?x8xi64> {
// CHECK-NEXT:    dist.assert_reduced %ct, %q : tensor<?x?x8xi64>, tensor<4xi64>
// CHECK-NEXT:    %q_cast = tensor.cast %q : tensor<4xi64> to tensor<?xi64>
// CHECK-NEXT:    %y = dist.all_reduce %ct, %q_cast commutative {known_combine = "modular-add"} : tensor<?x?x8xi64>, tensor<?xi64> combine(%lhs, %rhs, %q_limbs) {
// CHECK-NEXT:      %c0 = arith.constant 0 : index
// CHECK-NEXT:      %dim0 = tensor.dim %lhs, %c0 : tensor<?x?x8xi64>
// CHECK-NEXT:      %c1 = arith.constant 1 : index
// CHECK-NEXT:      %dim1 = tensor.dim %lhs, %c1 : tensor<?x?x8xi64>
// CHECK-NEXT:      %empty = tensor.empty(%dim0, %dim1) : tensor<?x?x8xi64>
// CHECK-NEXT:      %mod = linalg.broadcast ins(%q_limbs:tensor<?xi64>) outs(%empty:tensor<?x?x8xi64>) dimensions = [0, 2]
// CHECK-NEXT:      %sum = arith.addi %lhs, %rhs : tensor<?x?x8xi64>
// CHECK-NEXT:      %sum_minus_q = arith.subi %sum, %mod : tensor<?x?x8xi64>
// CHECK-NEXT:      %c63_scalar = arith.constant 63 : i64
// CHECK-NEXT:      %c63 = tensor.splat %c63_scalar[%dim0, %dim1] : tensor<?x?x8xi64>
// CHECK-NEXT:      %below_q = arith.shrsi %sum_minus_q, %c63 : tensor<?x?x8xi64>
// CHECK-NEXT:      %add_back = arith.andi %below_q, %mod : tensor<?x?x8xi64>
// CHECK-NEXT:      %reduced = arith.addi %sum_minus_q, %add_back : tensor<?x?x8xi64>
// CHECK-NEXT:      dist.yield %reduced : tensor<?x?x8xi64>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %y : tensor<?x?x8xi64>
// CHECK-NEXT:  }

// CHECK-NOT: dist.all_reduce_add_ciphertext
