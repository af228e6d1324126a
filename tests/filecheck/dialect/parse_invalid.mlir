// RUN: distir-opt %s --split-input-file --parsing-diagnostics | filecheck %s

// Errors the custom syntax itself reports, one per chunk, located in the
// whole file: at the offending token, or, for a type its op's definition
// rejects (checked once the whole op is parsed), at the op.

func.func @main() {
  %r = dist.rank : i64
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:3
// CHECK: i64 should be of base attribute index
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) {
  %z = dist.all_reduce %x, %y : tensor<4xf32> combine(%a, %b) {
    dist.yield %a : tensor<4xf32>
  }
// CHECK: parse_invalid.mlir:[[# @LINE - 3]]:47
// CHECK: 'dist.all_reduce' has 2 operands but 1 types
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %z = dist.all_reduce %x : tensor<4xf32> combine(%a) {
    dist.yield %a : tensor<4xf32>
  }
// CHECK: parse_invalid.mlir:[[# @LINE - 3]]:55
// CHECK: 'dist.all_reduce' combine takes 2 arguments (lhs, rhs, then one per extra operand), got 1
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.broadcast %x root 0 group "tp" : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:39
// CHECK: expected a group symbol such as @tp after `group`
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_gather %x axis 0 : tensor<4xf32> -> index
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:3
// CHECK: index should be of base attribute tensor
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_reduce average %x : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:24
// CHECK: operand expected
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.frobnicate %x : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:24
// CHECK: Operation dist.frobnicate is not registered
  func.return
}
