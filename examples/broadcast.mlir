// Broadcast from a static root and from a root computed at run time (the last rank). Run: distir-opt examples/broadcast.mlir
builtin.module {
  func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
    %y = dist.broadcast %x root 0 : tensor<4x8xf32>
    %size = dist.group_size : index
    %one = arith.constant 1 : index
    %last = arith.subi %size, %one : index
    %z = dist.broadcast %x root %last : tensor<4x8xf32>
    func.return %y, %z : tensor<4x8xf32>, tensor<4x8xf32>
  }
}
