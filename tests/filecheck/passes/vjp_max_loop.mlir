// RUN: distir-opt %s -p vjp | filecheck %s

// A max all-reduce's gradient goes to the lowest rank holding the maximum
// (a min all-reduce of rank numbers picks it); a loop of constant bounds is
// unrolled in @main_fwd, each iteration keeping its own residuals.

func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %lo = arith.constant 0 : index
  %hi = arith.constant 2 : index
  %one = arith.constant 1 : index
  %y = scf.for %i = %lo to %hi step %one iter_args(%acc = %x) -> (tensor<4xf32>) {
    %m = dist.all_reduce max %acc : tensor<4xf32>
    %q = arith.mulf %m, %acc : tensor<4xf32>
    scf.yield %q : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}

// CHECK-LABEL: func.func @main_fwd(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
// CHECK-NEXT:    %lo = arith.constant 0 : index
// CHECK-NEXT:    %hi = arith.constant 2 : index
// CHECK-NEXT:    %one = arith.constant 1 : index
// CHECK-NEXT:    %m_iter0 = dist.all_reduce max %x : tensor<4xf32>
// CHECK-NEXT:    %q_iter0 = arith.mulf %m_iter0, %x : tensor<4xf32>
// CHECK-NEXT:    %m_iter1 = dist.all_reduce max %q_iter0 : tensor<4xf32>
// CHECK-NEXT:    %q_iter1 = arith.mulf %m_iter1, %q_iter0 : tensor<4xf32>
// CHECK-NEXT:    func.return %q_iter1, %q_iter0, %m_iter1, %x, %m_iter0 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
// CHECK-LABEL: func.func @main_bwd(%dq_iter1: tensor<4xf32>, %q_iter0: tensor<4xf32>, %m_iter1: tensor<4xf32>, %x: tensor<4xf32>, %m_iter0: tensor<4xf32>) -> tensor<4xf32> {
// CHECK-NEXT:    %0 = arith.mulf %dq_iter1, %q_iter0 : tensor<4xf32>
// CHECK-NEXT:    %1 = arith.mulf %dq_iter1, %m_iter1 : tensor<4xf32>
// CHECK-NEXT:    %2 = dist.rank : index
// CHECK-NEXT:    %3 = arith.index_cast %2 : index to i64
// CHECK-NEXT:    %4 = arith.constant 9223372036854775807 : i64
// CHECK-NEXT:    %5 = tensor.splat %3 : tensor<4xi64>
// CHECK-NEXT:    %6 = tensor.splat %4 : tensor<4xi64>
// CHECK-NEXT:    %7 = arith.cmpf oeq, %q_iter0, %m_iter1 : tensor<4xf32>
// CHECK-NEXT:    %8 = arith.select %7, %5, %6 : tensor<4xi1>, tensor<4xi64>
// CHECK-NEXT:    %9 = arith.cmpf uno, %q_iter0, %q_iter0 : tensor<4xf32>
// CHECK-NEXT:    %10 = arith.select %9, %5, %6 : tensor<4xi1>, tensor<4xi64>
// CHECK-NEXT:    %11 = arith.cmpf uno, %m_iter1, %m_iter1 : tensor<4xf32>
// CHECK-NEXT:    %12 = arith.select %11, %10, %8 : tensor<4xi1>, tensor<4xi64>
// CHECK-NEXT:    %13 = dist.all_reduce min %12 : tensor<4xi64>
// CHECK-NEXT:    %14 = arith.cmpi eq, %13, %5 : tensor<4xi64>
// CHECK-NEXT:    %15 = dist.all_reduce sum %0 : tensor<4xf32>
// CHECK-NEXT:    %16 = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    %17 = tensor.splat %16 : tensor<4xf32>
// CHECK-NEXT:    %18 = arith.select %14, %15, %17 : tensor<4xi1>, tensor<4xf32>
// CHECK-NEXT:    %19 = arith.addf %1, %18 : tensor<4xf32>
// CHECK-NEXT:    %20 = arith.mulf %19, %x : tensor<4xf32>
// CHECK-NEXT:    %21 = arith.mulf %19, %m_iter0 : tensor<4xf32>
// CHECK-NEXT:    %22 = dist.rank : index
// CHECK-NEXT:    %23 = arith.index_cast %22 : index to i64
// CHECK-NEXT:    %24 = arith.constant 9223372036854775807 : i64
// CHECK-NEXT:    %25 = tensor.splat %23 : tensor<4xi64>
// CHECK-NEXT:    %26 = tensor.splat %24 : tensor<4xi64>
// CHECK-NEXT:    %27 = arith.cmpf oeq, %x, %m_iter0 : tensor<4xf32>
// CHECK-NEXT:    %28 = arith.select %27, %25, %26 : tensor<4xi1>, tensor<4xi64>
// CHECK-NEXT:    %29 = arith.cmpf uno, %x, %x : tensor<4xf32>
// CHECK-NEXT:    %30 = arith.select %29, %25, %26 : tensor<4xi1>, tensor<4xi64>
// CHECK-NEXT:    %31 = arith.cmpf uno, %m_iter0, %m_iter0 : tensor<4xf32>
// CHECK-NEXT:    %32 = arith.select %31, %30, %28 : tensor<4xi1>, tensor<4xi64>
// CHECK-NEXT:    %33 = dist.all_reduce min %32 : tensor<4xi64>
// CHECK-NEXT:    %34 = arith.cmpi eq, %33, %25 : tensor<4xi64>
// CHECK-NEXT:    %35 = dist.all_reduce sum %20 : tensor<4xf32>
// CHECK-NEXT:    %36 = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    %37 = tensor.splat %36 : tensor<4xf32>
// CHECK-NEXT:    %38 = arith.select %34, %35, %37 : tensor<4xi1>, tensor<4xf32>
// CHECK-NEXT:    %39 = arith.addf %21, %38 : tensor<4xf32>
// CHECK-NEXT:    func.return %39 : tensor<4xf32>
