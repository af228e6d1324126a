// A wave submits independent collectives together and awaits them all: gradients of two layers reduced at once. Run: distir-opt examples/wave.mlir
builtin.module {
  func.func @main(%g1: tensor<1024xf32>, %g2: tensor<256x64xf32>) -> (tensor<1024xf32>, tensor<256x64xf32>) {
    %s1, %s2 = dist.wave {
      %0 = dist.all_reduce sum %g1 : tensor<1024xf32>
      %1 = dist.all_reduce sum %g2 : tensor<256x64xf32>
      dist.yield %0, %1 : tensor<1024xf32>, tensor<256x64xf32>
    } : tensor<1024xf32>, tensor<256x64xf32>
    func.return %s1, %s2 : tensor<1024xf32>, tensor<256x64xf32>
  }
}
