// RUN: distir-opt %s --split-input-file --verify-diagnostics | filecheck %s

// One verifier rule per chunk. Locations count lines of the whole file, not
// of the chunk, so each CHECK names the line just above it.

dist.group @g [[0, 1], [1, 2]]
// CHECK: invalid.mlir:[[# @LINE - 1]]:1: error: group @g: rank 1 appears in more than one place

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_reduce sum %x group @missing : tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.all_reduce' names group @missing but no `dist.group` of that name is declared at module level
  func.return
}

// -----

dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%x: tensor<4xf32>) {
  %y = dist.broadcast %x root 2 group @pairs : tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.broadcast' root 2 is outside group @pairs of size 2
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_reduce bxor %x : tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.all_reduce' kind bxor needs an integer element type, got tensor<4xf32>
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_reduce %x : tensor<4xf32> combine(%a, %b) {
    dist.yield %a, %b : tensor<4xf32>, tensor<4xf32>
  }
// CHECK: invalid.mlir:[[# @LINE - 3]]:3: error: 'dist.all_reduce' combine must yield one value of type tensor<4xf32>, got (tensor<4xf32>, tensor<4xf32>)
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_reduce %x : tensor<4xf32> combine(%a, %b) {
    %c = arith.addf %a, %b : tensor<4xf32>
  }
// CHECK: invalid.mlir:[[# @LINE - 2]]:5: error: Operation arith.addf terminates block in single-block region but is not a terminator
  func.return
}

// -----

func.func @main(%ct: tensor<2x3x16xi64>, %q: tensor<4xi64>) {
  %y = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x16xi64>, tensor<4xi64>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.all_reduce_add_ciphertext' has 4 moduli for 3 limbs (dimension -2 of tensor<2x3x16xi64>)
  func.return
}

// -----

func.func @main(%ct: tensor<2x3x16xi64>, %q: tensor<3xi64>) {
  %y = dist.all_reduce_add_ciphertext %ct, %q max_modulus_bits 63 : tensor<2x3x16xi64>, tensor<3xi64>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.all_reduce_add_ciphertext' max_modulus_bits must be in [2, 62], got 63
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.all_gather %x axis 0 : tensor<4xf32> -> tensor<10xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.all_gather' result rows (10) on axis 0 must be a multiple of the input rows (4)
  func.return
}

// -----

func.func @main(%x: tensor<2x4xf32>, %c: tensor<4xf32>) {
  %y = dist.all_gather %x counts(%c : tensor<4xf32>) axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.all_gather' counts must be a tensor of integers, got tensor<4xf32>
  func.return
}

// -----

dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%x: tensor<?x16xf32>, %c: tensor<4xi64>) {
  %y, %rc = dist.variable_all_to_all %x, %c axis 0 group @pairs : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x16xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.variable_all_to_all' send counts has 4 entries for a group of size 2
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  dist.yield %x : tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.yield' expects parent op {{.*}}'dist.all_reduce'
}

// -----

dist.group @pairs [[0, 1], [2, 3]]
func.func @main(%x: tensor<4xf32>) {
  dist.send %x to 2 group @pairs : tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.send' destination 2 is outside group @pairs of size 2
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.wave {
    %a = dist.all_reduce sum %x : tensor<4xf32>
    %b = dist.broadcast %a root 0 : tensor<4xf32>
// The wave reports it, so the location is the wave's.
// CHECK: invalid.mlir:[[# @LINE - 4]]:3: error: 'dist.broadcast' in a 'dist.wave' reads the result of another op of the same wave
    dist.yield %b : tensor<4xf32>
  } : tensor<4xf32>
  func.return
}

// -----

dist.mesh @train [2, 2] ranks [0, 1, 2]
// CHECK: invalid.mlir:[[# @LINE - 1]]:1: error: mesh @train of shape [2, 2] needs 4 ranks, got 3

// -----

dist.mesh @train [2, 2] ranks [0, 1, 2, 3]
func.func @main(%x: tensor<2x8xf32>) {
  %y = dist.transfer %x from @train [0, *] partial [0] to @train [0, *] global [4, 8] : tensor<2x8xf32> -> tensor<2x8xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.transfer' source partial axis 0 must be a mesh axis of @train that shards no dim (it shards tensor dim 0)
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.reduce_scatter sum %x axis 1 : tensor<4xf32> -> tensor<2xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.reduce_scatter' axis 1 is out of range for tensor<4xf32> (rank 1)
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.reduce_scatter sum %x axis 0 : tensor<4xf32> -> tensor<3xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.reduce_scatter' result rows (3) on axis 0 must be the input rows (4) divided by the group size
  func.return
}

// -----

dist.group @world4 [[0, 1, 2, 3]]
func.func @main(%x: tensor<6xf32>) {
  %y = dist.reduce_scatter sum %x axis 0 group @world4 : tensor<6xf32> -> tensor<2xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.reduce_scatter' input has 6 rows on axis 0, which do not split evenly over a group of size 4
  func.return
}

// -----

dist.group @world4 [[0, 1, 2, 3]]
func.func @main(%x: tensor<8xf32>) {
  %y = dist.reduce_scatter sum %x axis 0 group @world4 : tensor<8xf32> -> tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.reduce_scatter' result has 4 rows on axis 0, expected 8 / 4 = 2
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.reduce_scatter bxor %x axis 0 : tensor<4xf32> -> tensor<2xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.reduce_scatter' kind bxor needs an integer element type, got tensor<4xf32>
  func.return
}

// -----

func.func @main(%x: tensor<4x2xf32>) {
  %y = dist.reduce_scatter sum %x axis 0 : tensor<4x2xf32> -> tensor<2x3xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.reduce_scatter' result tensor<2x3xf32> differs from input tensor<4x2xf32> in dimension 1, which is not the axis 0
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = dist.psum %x group @nowhere : tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.psum' names group @nowhere but no `dist.group` of that name is declared at module level
  func.return
}

// -----

dist.group @world4 [[0, 1, 2, 3]]
func.func @main(%x: tensor<4xf32>) {
  %y = dist.gather %x axis 0 root 4 group @world4 : tensor<4xf32> -> tensor<16xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.gather' root 4 is outside group @world4 of size 4
  func.return
}

// -----

func.func @main(%x: tensor<4xf32>) {
  %y = "dist.pvary"(%x) : (tensor<4xf32>) -> tensor<3xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: result 'result' at position 0 does not verify:
// CHECK-NEXT: attribute tensor<4xf32> expected from variable 'T', but got tensor<3xf32>
  func.return
}

// -----

dist.group @world4 [[0, 1, 2, 3]]
func.func @main(%x: tensor<6xf32>) {
  %y = dist.scatter %x axis 0 root 0 group @world4 : tensor<6xf32> -> tensor<?xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.scatter' 6 rows on axis 0 do not split evenly over a group of size 4
  func.return
}

// -----

dist.group @world4 [[0, 1, 2, 3]]
func.func @main(%x: tensor<4xf32>) {
  %y = dist.reduce sum %x root 7 group @world4 : tensor<4xf32>
// CHECK: invalid.mlir:[[# @LINE - 1]]:3: error: 'dist.reduce' root 7 is outside group @world4 of size 4
  func.return
}
