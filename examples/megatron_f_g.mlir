// Megatron's f and g around one rank's shard of a layer: f (dist.pvary)
// is the identity forward and sums the gradient over ranks backward; g
// (dist.psum) sums forward and passes the gradient on backward. %x and the
// bias %b are replicated (one value every rank holds), %w is this rank's.
func.func @main(%x: tensor<4xf32> {dist.replicated}, %w: tensor<4xf32>, %b: tensor<4xf32> {dist.replicated}) -> tensor<4xf32> {
  %h = dist.pvary %x : tensor<4xf32>
  %partial = arith.mulf %h, %w : tensor<4xf32>
  %y = dist.psum %partial : tensor<4xf32>
  %out = arith.addf %y, %b : tensor<4xf32>
  func.return %out : tensor<4xf32>
}
