// A native sum all-reduce and a generic one whose combine, (lhs + rhs) mod m, takes the modulus as an extra operand. Run: distir-opt examples/all_reduce.mlir
builtin.module {
  func.func @main(%x: tensor<8xi64>, %m: tensor<8xi64>) -> (tensor<8xi64>, tensor<8xi64>) {
    %sum = dist.all_reduce sum %x : tensor<8xi64>
    %modsum = dist.all_reduce %x, %m commutative : tensor<8xi64>, tensor<8xi64> combine(%lhs, %rhs, %mod) {
      %s = arith.addi %lhs, %rhs : tensor<8xi64>
      %r = arith.remui %s, %mod : tensor<8xi64>
      dist.yield %r : tensor<8xi64>
    }
    func.return %sum, %modsum : tensor<8xi64>, tensor<8xi64>
  }
}
