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
// CHECK-NEXT:    %0 = dist.all_reduce sum %dg group @tp : tensor<?xf32>
// CHECK-NEXT:    %1 = dist.rank group @tp : index
// CHECK-NEXT:    %2 = arith.constant 4 : index
// CHECK-NEXT:    %3 = arith.muli %1, %2 : index
// CHECK-NEXT:    %4 = tensor.extract_slice %0[%3] [4] [1] : tensor<?xf32> to tensor<4xf32>
// CHECK-NEXT:    %5 = dist.all_reduce sum %4 : tensor<4xf32>
// CHECK-NEXT:    %6 = arith.constant 1 : index
// CHECK-NEXT:    %7 = dist.rank : index
// CHECK-NEXT:    %8 = arith.cmpi eq, %7, %6 : index
// CHECK:         %11 = arith.select %8, %5, %10 : tensor<4xf32>
// CHECK-NEXT:    %12 = arith.addf %ds, %11 : tensor<4xf32>
// CHECK-NEXT:    %13 = dist.all_reduce sum %12 group @tp : tensor<4xf32>
// CHECK-NEXT:    %14 = arith.mulf %13, %w : tensor<4xf32>
// CHECK-NEXT:    %15 = arith.mulf %13, %x : tensor<4xf32>
// CHECK-NEXT:    func.return %14, %15 : tensor<4xf32>, tensor<4xf32>
