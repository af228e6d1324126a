// Abs-max: per element, the value of largest magnitude across ranks (a tie between x and -x gives +x; NaN wins). Elementwise and commutative, so every all-reduce algorithm may run it. Run: distir-run examples/abs_max.mlir --nproc 4
builtin.module {
  func.func @main(%x: tensor<6xf32>) -> tensor<6xf32> {
    %y = dist.all_reduce %x commutative : tensor<6xf32> combine(%a, %b) {
      %abs_a = math.absf %a : tensor<6xf32>
      %abs_b = math.absf %b : tensor<6xf32>
      %a_wins = arith.cmpf ogt, %abs_a, %abs_b : tensor<6xf32>
      %b_wins = arith.cmpf olt, %abs_a, %abs_b : tensor<6xf32>
      %tie = arith.maximumf %a, %b : tensor<6xf32>
      %b_or_tie = arith.select %b_wins, %b, %tie : tensor<6xi1>, tensor<6xf32>
      %r = arith.select %a_wins, %a, %b_or_tie : tensor<6xi1>, tensor<6xf32>
      dist.yield %r : tensor<6xf32>
    }
    func.return %y : tensor<6xf32>
  }
}
