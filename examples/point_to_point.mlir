// Point-to-point: a ring shift with one deadlock-free dist.sendrecv, then, inside each pair of @pairs, group rank 0 sends and group rank 1 receives. Run: distir-run examples/point_to_point.mlir --nproc 4 (print it: distir-opt examples/point_to_point.mlir)
builtin.module {
  dist.group @pairs [[0, 1], [2, 3]]
  func.func @main(%x: tensor<8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
    %n = dist.group_size : index
    %r = dist.rank : index
    %one = arith.constant 1 : index
    %r_inc = arith.addi %r, %one : index
    %next = arith.remui %r_inc, %n : index
    %r_plus_n = arith.addi %r, %n : index
    %r_dec = arith.subi %r_plus_n, %one : index
    %prev = arith.remui %r_dec, %n : index
    %shifted = dist.sendrecv %x to %next from %prev : tensor<8xf32> -> tensor<8xf32>
    %in_pair = dist.rank group @pairs : index
    %zero = arith.constant 0 : index
    %is_sender = arith.cmpi eq, %in_pair, %zero : index
    %from_partner = scf.if %is_sender -> (tensor<8xf32>) {
      dist.send %shifted to 1 group @pairs : tensor<8xf32>
      scf.yield %shifted : tensor<8xf32>
    } else {
      %received = dist.recv from 0 group @pairs : tensor<8xf32>
      scf.yield %received : tensor<8xf32>
    }
    func.return %shifted, %from_partner : tensor<8xf32>, tensor<8xf32>
  }
}
