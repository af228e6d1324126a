// RUN: distir-opt %s -p vjp | filecheck %s

// The backward of a program is a program: each collective's transpose, in
// reverse order; nonlinear local ops read residuals that @main_fwd returns.

dist.group @tp [[0, 1], [2, 3]]

func.func @main(%x: tensor<4xf32>, %w: tensor<4xf32>, %c: tensor<2xi64>) -> (tensor<?xf32>, tensor<4xf32>) {
  %p = arith.mulf %x, %w : tensor<4xf32>
  %s = dist.all_reduce sum %p group @tp : tensor<4xf32>
  %b = dist.broadcast %s root 1 : tensor<4xf32>
  %g = dist.all_gather %b axis 0 group @tp : tensor<4xf32> -> tensor<?xf32>
  func.return %g, %s : tensor<?xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @main_fwd(%x: tensor<4xf32>, %w: tensor<4xf32>, %c: tensor<2xi64>) -> (tensor<?xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>)
// CHECK:         func.return %g, %s, %w, %x : tensor<?xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>

// CHECK-LABEL: func.func @main_bwd(%dg: tensor<?xf32>, %ds: tensor<4xf32>, %w: tensor<4xf32>, %x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
// CHECK-NEXT:    %0 = dist.reduce_scatter sum %dg axis 0 group @tp : tensor<?xf32> -> tensor<4xf32>
// CHECK-NEXT:    %1 = dist.reduce sum %0 root 1 : tensor<4xf32>
// CHECK-NEXT:    %2 = arith.addf %ds, %1 : tensor<4xf32>
// CHECK-NEXT:    %3 = dist.all_reduce sum %2 group @tp : tensor<4xf32>
// CHECK-NEXT:    %4 = arith.mulf %3, %w : tensor<4xf32>
// CHECK-NEXT:    %5 = arith.mulf %3, %x : tensor<4xf32>
// CHECK-NEXT:    func.return %4, %5 : tensor<4xf32>, tensor<4xf32>
