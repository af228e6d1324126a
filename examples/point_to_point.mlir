// Point-to-point: a ring shift with one deadlock-free dist.sendrecv, then rank-pair send/recv inside @pairs. Run: distir-opt examples/point_to_point.mlir
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<8xf32>, %next: index, %prev: index) -> (tensor<8xf32>, tensor<8xf32>) {
    %shifted = dist.sendrecv %x to %next from %prev : tensor<8xf32> -> tensor<8xf32>
    dist.send %shifted to 1 group @pairs : tensor<8xf32>
    %from_partner = dist.recv from 0 group @pairs : tensor<8xf32>
    func.return %shifted, %from_partner : tensor<8xf32>, tensor<8xf32>
  }
}
