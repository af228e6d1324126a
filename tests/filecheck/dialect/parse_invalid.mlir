// RUN: distir-opt %s --split-input-file --parsing-diagnostics | filecheck %s

// Errors the custom syntax itself reports, one per chunk, located in the
// whole file. `{{[0-9]+}}` lines: the dialect raises some errors after it has
// consumed the result type, so xDSL places them at the next token (the next
// line); the check accepts any line there until the dialect passes the
// op's own position to `raise_error`.

func.func @main() {
  %r = dist.rank : i64
// CHECK: parse_invalid.mlir:{{[0-9]+}}:{{[0-9]+}}
// CHECK: 'dist.rank' returns index, not i64
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
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:{{[0-9]+}}
// CHECK: expected a group symbol such as @tp after `group`
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_gather %x axis 0 : tensor<4xf32> -> index
// CHECK: parse_invalid.mlir:{{[0-9]+}}:{{[0-9]+}}
// CHECK: 'dist.all_gather' result must be a tensor, got index
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_reduce average %x : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:{{[0-9]+}}
// CHECK: operand expected
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.frobnicate %x : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:{{[0-9]+}}
// CHECK: Operation dist.frobnicate is not registered
  func.return
}
