// The memref forms of upstream's ShardToMPI tests (all_reduce, reduce_scatter in its scatter_dim spelling, update_halo), run as values on a 2x2 grid; docs/shard.md shows its conversion.
shard.grid @mesh(shape = 2x2)
func.func @main(%x: memref<4x3xf32>) -> (memref<4x3xf64>, memref<2x3xf32>, memref<4x3xf32>) {
  %max = shard.all_reduce %x on @mesh grid_axes = [0, 1] reduction = max : memref<4x3xf32> -> memref<4x3xf64>
  %part = shard.reduce_scatter %x on @mesh grid_axes = [1] scatter_dim = 0 : memref<4x3xf32> -> memref<2x3xf32>
  %halo = shard.update_halo %x on @mesh split_axes = [[0]] halo_sizes = [1, 1] : memref<4x3xf32>
  func.return %max, %part, %halo : memref<4x3xf64>, memref<2x3xf32>, memref<4x3xf32>
}
