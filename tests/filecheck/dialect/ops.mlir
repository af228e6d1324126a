// RUN: distir-opt %s | distir-opt | filecheck %s
// RUN: distir-opt %s --print-op-generic | distir-opt | filecheck %s

// Every dist op in its custom syntax: printed, re-parsed and printed again
// (first RUN), and through the generic form (second RUN).

dist.group @pairs [[0, 1], [2, 3]]
dist.group @world4 [[0, 1, 2, 3]]

// CHECK:      builtin.module {
// CHECK-NEXT:   dist.group @pairs [[0, 1], [2, 3]]
// CHECK-NEXT:   dist.group @world4 [[0, 1, 2, 3]]

func.func @queries() -> (index, index, index) {
  %r = dist.rank : index
  %p = dist.group_size : index
  %q = dist.rank group @pairs : index
  func.return %r, %p, %q : index, index, index
}

// CHECK-LABEL: func.func @queries() -> (index, index, index) {
// CHECK-NEXT:    %r = dist.rank : index
// CHECK-NEXT:    %p = dist.group_size : index
// CHECK-NEXT:    %q = dist.rank group @pairs : index

func.func @broadcast(%x: tensor<4xf32>, %root: index) -> (tensor<4xf32>, tensor<4xf32>) {
  %a = dist.broadcast %x root 0 : tensor<4xf32>
  %b = dist.broadcast %a root %root group @pairs : tensor<4xf32>
  func.return %a, %b : tensor<4xf32>, tensor<4xf32>
}

// CHECK-LABEL: func.func @broadcast
// CHECK-NEXT:    %a = dist.broadcast %x root 0 : tensor<4xf32>
// CHECK-NEXT:    %b = dist.broadcast %a root %root group @pairs : tensor<4xf32>

func.func @native(%x: tensor<8xi32>) -> tensor<8xi32> {
  %0 = dist.all_reduce sum %x : tensor<8xi32>
  %1 = dist.all_reduce prod %0 : tensor<8xi32>
  %2 = dist.all_reduce min %1 : tensor<8xi32>
  %3 = dist.all_reduce max %2 group @world4 : tensor<8xi32>
  %4 = dist.all_reduce band %3 : tensor<8xi32>
  %5 = dist.all_reduce bor %4 algorithm "ring" : tensor<8xi32>
  %6 = dist.all_reduce bxor %5 {tag = 1 : i64} : tensor<8xi32>
  func.return %6 : tensor<8xi32>
}

// CHECK-LABEL: func.func @native
// CHECK-NEXT:    %0 = dist.all_reduce sum %x : tensor<8xi32>
// CHECK-NEXT:    %1 = dist.all_reduce prod %0 : tensor<8xi32>
// CHECK-NEXT:    %2 = dist.all_reduce min %1 : tensor<8xi32>
// CHECK-NEXT:    %3 = dist.all_reduce max %2 group @world4 : tensor<8xi32>
// CHECK-NEXT:    %4 = dist.all_reduce band %3 : tensor<8xi32>
// CHECK-NEXT:    %5 = dist.all_reduce bor %4 algorithm "ring" : tensor<8xi32>
// CHECK-NEXT:    %6 = dist.all_reduce bxor %5 {tag = 1 : i64} : tensor<8xi32>

func.func @generic(%x: tensor<4xi64>, %m: tensor<4xi64>) -> tensor<4xi64> {
  %y = dist.all_reduce %x, %m group @pairs commutative : tensor<4xi64>, tensor<4xi64> combine(%lhs, %rhs, %mod) {
    %s = arith.addi %lhs, %rhs : tensor<4xi64>
    %r = arith.remui %s, %mod : tensor<4xi64>
    dist.yield %r : tensor<4xi64>
  }
  func.return %y : tensor<4xi64>
}

// CHECK-LABEL: func.func @generic
// CHECK-NEXT:    %y = dist.all_reduce %x, %m group @pairs commutative : tensor<4xi64>, tensor<4xi64> combine(%lhs, %rhs, %mod) {
// CHECK-NEXT:      %s = arith.addi %lhs, %rhs : tensor<4xi64>
// CHECK-NEXT:      %r = arith.remui %s, %mod : tensor<4xi64>
// CHECK-NEXT:      dist.yield %r : tensor<4xi64>
// CHECK-NEXT:    }

func.func @ciphertext(%ct: tensor<2x3x16xi64>, %q: tensor<3xi64>) -> (tensor<2x3x16xi64>, tensor<2x3x16xi64>) {
  %a = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x16xi64>, tensor<3xi64>
  %b = dist.all_reduce_add_ciphertext %a, %q basis "P" max_modulus_bits 60 group @pairs : tensor<2x3x16xi64>, tensor<3xi64>
  dist.assert_reduced %b, %q : tensor<2x3x16xi64>, tensor<3xi64>
  dist.assert_reduced %b, %q max_modulus_bits 60 : tensor<2x3x16xi64>, tensor<3xi64>
  dist.assert_uniform %q group @pairs : tensor<3xi64>
  func.return %a, %b : tensor<2x3x16xi64>, tensor<2x3x16xi64>
}

// CHECK-LABEL: func.func @ciphertext
// CHECK-NEXT:    %a = dist.all_reduce_add_ciphertext %ct, %q : tensor<2x3x16xi64>, tensor<3xi64>
// CHECK-NEXT:    %b = dist.all_reduce_add_ciphertext %a, %q basis "P" max_modulus_bits 60 group @pairs : tensor<2x3x16xi64>, tensor<3xi64>
// CHECK-NEXT:    dist.assert_reduced %b, %q : tensor<2x3x16xi64>, tensor<3xi64>
// CHECK-NEXT:    dist.assert_reduced %b, %q max_modulus_bits 60 : tensor<2x3x16xi64>, tensor<3xi64>
// CHECK-NEXT:    dist.assert_uniform %q group @pairs : tensor<3xi64>

func.func @gather(%x: tensor<2x4xf32>, %c: tensor<4xi64>) -> (tensor<8x4xf32>, tensor<?x4xf32>) {
  %even = dist.all_gather %x axis 0 group @world4 : tensor<2x4xf32> -> tensor<8x4xf32>
  %uneven = dist.all_gather %x counts(%c : tensor<4xi64>) axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>
  func.return %even, %uneven : tensor<8x4xf32>, tensor<?x4xf32>
}

// CHECK-LABEL: func.func @gather
// CHECK-NEXT:    %even = dist.all_gather %x axis 0 group @world4 : tensor<2x4xf32> -> tensor<8x4xf32>
// CHECK-NEXT:    %uneven = dist.all_gather %x counts(%c : tensor<4xi64>) axis 0 : tensor<2x4xf32> -> tensor<?x4xf32>

func.func @reduce_scatter(%x: tensor<8x4xf32>, %i: tensor<3x8xi32>) -> (tensor<2x4xf32>, tensor<3x4xi32>) {
  %y = dist.reduce_scatter sum %x axis 0 group @world4 : tensor<8x4xf32> -> tensor<2x4xf32>
  %z = dist.reduce_scatter bxor %i axis 1 : tensor<3x8xi32> -> tensor<3x4xi32>
  func.return %y, %z : tensor<2x4xf32>, tensor<3x4xi32>
}

// CHECK-LABEL: func.func @reduce_scatter
// CHECK-NEXT:    %y = dist.reduce_scatter sum %x axis 0 group @world4 : tensor<8x4xf32> -> tensor<2x4xf32>
// CHECK-NEXT:    %z = dist.reduce_scatter bxor %i axis 1 : tensor<3x8xi32> -> tensor<3x4xi32>

func.func @replication(%x: tensor<2x4xf32> {dist.replicated}, %p: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  %f = dist.pvary %x : tensor<2x4xf32>
  %g = dist.psum %p group @pairs : tensor<2x4xf32>
  func.return %f, %g : tensor<2x4xf32>, tensor<2x4xf32>
}

// CHECK-LABEL: func.func @replication
// CHECK-NEXT:    %f = dist.pvary %x : tensor<2x4xf32>
// CHECK-NEXT:    %g = dist.psum %p group @pairs : tensor<2x4xf32>

func.func @gather_scatter(%x: tensor<2x4xf32>, %c: tensor<4xi64>) -> (tensor<8x4xf32>, tensor<?x4xf32>) {
  %g = dist.gather %x axis 0 root 3 group @world4 : tensor<2x4xf32> -> tensor<8x4xf32>
  %s = dist.scatter %g counts(%c : tensor<4xi64>) axis 0 root 0 group @world4 : tensor<8x4xf32> -> tensor<?x4xf32>
  func.return %g, %s : tensor<8x4xf32>, tensor<?x4xf32>
}

// CHECK-LABEL: func.func @gather_scatter
// CHECK-NEXT:    %g = dist.gather %x axis 0 root 3 group @world4 : tensor<2x4xf32> -> tensor<8x4xf32>
// CHECK-NEXT:    %s = dist.scatter %g counts(%c : tensor<4xi64>) axis 0 root 0 group @world4 : tensor<8x4xf32> -> tensor<?x4xf32>

func.func @reduce(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %r = dist.reduce min %x root 2 group @world4 : tensor<2x4xf32>
  func.return %r : tensor<2x4xf32>
}

// CHECK-LABEL: func.func @reduce
// CHECK-NEXT:    %r = dist.reduce min %x root 2 group @world4 : tensor<2x4xf32>

func.func @shift(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  %ring = dist.shift %x offset 1 rotate group @world4 : tensor<2x4xf32>
  %halo = dist.shift %x offset -1 : tensor<2x4xf32>
  func.return %ring, %halo : tensor<2x4xf32>, tensor<2x4xf32>
}

// CHECK-LABEL: func.func @shift
// CHECK-NEXT:    %ring = dist.shift %x offset 1 rotate group @world4 : tensor<2x4xf32>
// CHECK-NEXT:    %halo = dist.shift %x offset -1 : tensor<2x4xf32>

func.func @all_to_all(%x: tensor<?x16xf32>, %c: tensor<4xi64>) -> (tensor<?x16xf32>, tensor<4xi64>) {
  %y, %rc = dist.variable_all_to_all %x, %c axis 0 group @world4 : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x16xf32>
  func.return %y, %rc : tensor<?x16xf32>, tensor<4xi64>
}

// CHECK-LABEL: func.func @all_to_all
// CHECK-NEXT:    %y, %rc = dist.variable_all_to_all %x, %c axis 0 group @world4 : tensor<?x16xf32>, tensor<4xi64> -> tensor<?x16xf32>
// CHECK-NEXT:    func.return %y, %rc : tensor<?x16xf32>, tensor<4xi64>

func.func @point_to_point(%x: tensor<4xf32>, %peer: index) -> (tensor<4xf32>, tensor<8xf32>) {
  dist.send %x to 1 : tensor<4xf32>
  %a = dist.recv from %peer group @pairs : tensor<4xf32>
  %b = dist.sendrecv %x to %peer from 0 : tensor<4xf32> -> tensor<8xf32>
  func.return %a, %b : tensor<4xf32>, tensor<8xf32>
}

// CHECK-LABEL: func.func @point_to_point
// CHECK-NEXT:    dist.send %x to 1 : tensor<4xf32>
// CHECK-NEXT:    %a = dist.recv from %peer group @pairs : tensor<4xf32>
// CHECK-NEXT:    %b = dist.sendrecv %x to %peer from 0 : tensor<4xf32> -> tensor<8xf32>

func.func @wave(%x: tensor<4xf32>, %y: tensor<8xi64>) -> (tensor<4xf32>, tensor<8xi64>) {
  %s, %t = dist.wave {
    %0 = dist.all_reduce sum %x : tensor<4xf32>
    %1 = dist.broadcast %y root 0 : tensor<8xi64>
    dist.yield %0, %1 : tensor<4xf32>, tensor<8xi64>
  } : tensor<4xf32>, tensor<8xi64>
  func.return %s, %t : tensor<4xf32>, tensor<8xi64>
}

// CHECK-LABEL: func.func @wave
// CHECK-NEXT:    %s, %t = dist.wave {
// CHECK-NEXT:      %0 = dist.all_reduce sum %x : tensor<4xf32>
// CHECK-NEXT:      %1 = dist.broadcast %y root 0 : tensor<8xi64>
// CHECK-NEXT:      dist.yield %0, %1 : tensor<4xf32>, tensor<8xi64>
// CHECK-NEXT:    } : tensor<4xf32>, tensor<8xi64>

dist.mesh @train [2, 2] ranks [0, 1, 2, 3]
dist.mesh @serve [4] ranks [4, 5, 6, 7]

// CHECK:       dist.mesh @train [2, 2] ranks [0, 1, 2, 3]
// CHECK-NEXT:  dist.mesh @serve [4] ranks [4, 5, 6, 7]

func.func @transfer(%p: tensor<4x8xf32>) -> tensor<1x8xf32> {
  %z = dist.transfer %p from @train [*, 1] partial [0] to @serve [0, *] global [4, 8] : tensor<4x8xf32> -> tensor<1x8xf32>
  func.return %z : tensor<1x8xf32>
}

// CHECK-LABEL: func.func @transfer
// CHECK-NEXT:    %z = dist.transfer %p from @train [*, 1] partial [0] to @serve [0, *] global [4, 8] : tensor<4x8xf32> -> tensor<1x8xf32>
