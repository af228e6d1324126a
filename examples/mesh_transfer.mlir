// Move a 4x6 weight matrix from a training mesh to an inference mesh.
// Source: mesh @train [2, 2] (ranks 0-3): rows sharded over axis 0, partial sums over axis 1 (the replica axis).
// Destination: mesh @infer [3] (ranks 3-5, overlapping @train at rank 3): columns sharded over its only axis.
// Run: distir-opt -p print-transfer-maps examples/mesh_transfer.mlir ; python examples/mesh_transfer.py
dist.mesh @train [2, 2] ranks [0, 1, 2, 3]
dist.mesh @infer [3] ranks [3, 4, 5]
func.func @main(%shard: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %weights = dist.transfer %shard from @train [0, *] partial [1] to @infer [*, 0] global [4, 6] : tensor<?x?xf32> -> tensor<?x?xf32>
  func.return %weights : tensor<?x?xf32>
}
