/* a·b mod m on 64-bit operands without overflow, through a 128-bit product (the
   grammar runtime's multipleOf check, r · 10^e mod m by squaring; GCC and clang on
   64-bit targets have __int128). */
#ifndef NEEDLE_CY_MULMOD_H
#define NEEDLE_CY_MULMOD_H

typedef unsigned __int128 ng_u128;
static inline unsigned long long ng_mulmod(unsigned long long a, unsigned long long b,
                                           unsigned long long m) {
    return (unsigned long long)(((ng_u128)a * b) % m);
}

#endif  /* NEEDLE_CY_MULMOD_H */
