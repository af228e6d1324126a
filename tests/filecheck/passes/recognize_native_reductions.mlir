// RUN: distir-opt %s -p recognize-native-reductions | filecheck %s

// A generic all-reduce whose combine is one commutative arith op on
// (lhs, rhs), in either order, is the native reduction of that kind.

dist.group @dp [[0, 2], [1, 3]]

func.func @main(%x: tensor<8xi64>, %f: tensor<8xf32>, %m: tensor<8xi64>) -> (tensor<8xi64>, tensor<8xf32>) {
  %a = dist.all_reduce %x group @dp : tensor<8xi64> combine(%lhs, %rhs) {
    %r = arith.maxsi %rhs, %lhs : tensor<8xi64>
    dist.yield %r : tensor<8xi64>
  }
  %b = dist.all_reduce %a, %m commutative : tensor<8xi64>, tensor<8xi64> combine(%lhs, %rhs, %unused) {
    %r = arith.xori %lhs, %rhs : tensor<8xi64>
    dist.yield %r : tensor<8xi64>
  }
  %c = dist.all_reduce %f : tensor<8xf32> combine(%lhs, %rhs) {
    %r = arith.addf %lhs, %rhs : tensor<8xf32>
    dist.yield %r : tensor<8xf32>
  }
  %d = dist.all_reduce %b : tensor<8xi64> combine(%lhs, %rhs) {
    %r = arith.maxui %lhs, %rhs : tensor<8xi64>
    dist.yield %r : tensor<8xi64>
  }
  func.return %d, %c : tensor<8xi64>, tensor<8xf32>
}

// CHECK-LABEL: func.func @main
// CHECK-NEXT:    %a = dist.all_reduce max %x group @dp : tensor<8xi64>
// CHECK-NEXT:    %b = dist.all_reduce bxor %a : tensor<8xi64>
// CHECK-NEXT:    %c = dist.all_reduce sum %f : tensor<8xf32>
// The native max is signed: an unsigned max stays generic.
// CHECK-NEXT:    %d = dist.all_reduce %b : tensor<8xi64> combine(%lhs, %rhs) {
// CHECK-NEXT:      %r = arith.maxui %lhs, %rhs : tensor<8xi64>
// CHECK-NEXT:      dist.yield %r : tensor<8xi64>
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return %d, %c : tensor<8xi64>, tensor<8xf32>
