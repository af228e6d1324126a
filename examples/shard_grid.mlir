// An MLIR shard program on a 2x2 grid: sum over axis 1, gather over axis 0, and each process's coordinates. Run: distir-run examples/shard_grid.mlir --nproc 4 -p convert-shard-to-dist
shard.grid @mesh(shape = 2x2)
func.func @main(%x: tensor<2x3xf32>) -> (tensor<4x3xf32>, index, index) {
  %sum = shard.all_reduce %x on @mesh grid_axes = [1] reduction = sum : tensor<2x3xf32> -> tensor<2x3xf32>
  %rows = shard.all_gather %sum on @mesh grid_axes = [0] gather_axis = 0 : tensor<2x3xf32> -> tensor<4x3xf32>
  %i:2 = shard.process_multi_index on @mesh : index, index
  func.return %rows, %i#0, %i#1 : tensor<4x3xf32>, index, index
}
