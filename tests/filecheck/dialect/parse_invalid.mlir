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
// CHECK: 'average' is not a reduction kind (the kinds are sum, prod, min, max, band, bor, bxor), nor an operand
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.frobnicate %x : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:8
// CHECK: Operation dist.frobnicate is not registered
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  dist.send %x to next : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:19
// CHECK: expected a group rank: an integer or an index value such as %r
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.broadcast %x root 99999999999999999999 : tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:3
// CHECK: Integer value 99999999999999999999 is out of range for type i64
  func.return
}

// -----

dist.group @g [[0, -1]]
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:20
// CHECK: expected a global rank (>= 0)

// -----

dist.mesh @m [2] ranks [0, 1]
func.func @main(%x: tensor<4xf32>) {
  %y = dist.transfer %x from @m [0, r] to @m [*] global [4] : tensor<4xf32> -> tensor<4xf32>
// CHECK: parse_invalid.mlir:[[# @LINE - 1]]:37
// CHECK: expected a mesh axis (>= 0) or `*` (replicated)
  func.return
}
