// An even all-gather (every rank sends 2 rows) and an uneven one (rank r sends counts[r] rows). Run: distir-opt examples/all_gather.mlir
builtin.module {
  func.func @main(%x: tensor<2x4xf32>, %rows: tensor<?x4xf32>, %counts: tensor<4xi64>) -> (tensor<?x4xf32>, tensor<?x4xf32>) {
    %even = dist.all_gather %x axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>
    %uneven = dist.all_gather %rows counts(%counts : tensor<4xi64>) axis 0 : tensor<?x4xf32> -> tensor<?x4xf32>
    func.return %even, %uneven : tensor<?x4xf32>, tensor<?x4xf32>
  }
}
