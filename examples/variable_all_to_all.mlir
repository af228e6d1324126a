// Mixture-of-experts token dispatch: send send_counts[j] rows to rank j, receive rows and their counts. Run: distir-opt examples/variable_all_to_all.mlir
builtin.module {
  func.func @main(%tokens: tensor<?x16xf32>, %send_counts: tensor<4xi64>) -> (tensor<?x16xf32>, tensor<4xi64>) {
    %received, %recv_counts = dist.variable_all_to_all %tokens, %send_counts axis 0 : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x16xf32>
    func.return %received, %recv_counts : tensor<?x16xf32>, tensor<4xi64>
  }
}
