// A commutative "saturating max" combine, min(max(lhs, rhs), ceiling), which no backend offers natively. Run: distir-opt examples/custom_combine.mlir
builtin.module {
  func.func @main(%x: tensor<4xf64>, %ceiling: tensor<4xf64>) -> tensor<4xf64> {
    %y = dist.all_reduce %x, %ceiling commutative : tensor<4xf64>, tensor<4xf64> combine(%lhs, %rhs, %cap) {
      %max = arith.maximumf %lhs, %rhs : tensor<4xf64>
      %sat = arith.minimumf %max, %cap : tensor<4xf64>
      dist.yield %sat : tensor<4xf64>
    }
    func.return %y : tensor<4xf64>
  }
}
