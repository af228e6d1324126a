// A grid whose second extent is dynamic: convert-shard-to-dist refuses it (docs/shard.md shows the error).
shard.grid @g(shape = 2x?)
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = shard.all_reduce %x on @g grid_axes = [0] : tensor<4xf32> -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
