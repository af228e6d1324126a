// Collectives on subgroups: @pairs splits ranks 0-3 into {0, 1} and {2, 3}; ranks in IR are ranks within a pair. Run: distir-opt examples/subgroups.mlir
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<8xf32>) -> (index, tensor<8xf32>, tensor<16xf32>) {
    %rank = dist.rank group @pairs : index
    %sum = dist.all_reduce sum %x group @pairs : tensor<8xf32>
    %from_second = dist.broadcast %sum root 1 group @pairs : tensor<8xf32>
    %both = dist.all_gather %from_second axis 0 group @pairs : tensor<8xf32> -> tensor<16xf32>
    func.return %rank, %from_second, %both : index, tensor<8xf32>, tensor<16xf32>
  }
}
