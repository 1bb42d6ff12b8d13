// ATOLL_CLONES: a function built once per x86 instruction set level (AVX-512 with its 64-bit
// multiplies, AVX2, and the baseline), the one the CPU has chosen when the program loads. Only
// for loops whose results do not depend on the instruction set (elementwise, integer sums, or
// float sums in fixed lanes), in files built with -ffp-contract=off (compression/CMakeLists.txt):
// x86-64-v4 has FMA, which would otherwise fuse a multiply and an add into other bits. Other
// compilers and targets build the one version.
#ifndef ATOLL_COMPRESSION_CLONES_H_
#define ATOLL_COMPRESSION_CLONES_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ATOLL_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define ATOLL_CLONES
#endif

#endif  // ATOLL_COMPRESSION_CLONES_H_
