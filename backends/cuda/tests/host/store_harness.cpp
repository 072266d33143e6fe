// Host-side check of the f32 → f16/bf16 rounding of kernels/elementwise.cu (see host_store.rs):
// the two device functions are compiled as plain C++ against the shims below; for each f32
// bit pattern read from the input file the program writes both results as u16 pairs.
#include <cstdio>
#include <cstring>
#define __device__
#define __forceinline__ inline
typedef unsigned short u16;
typedef unsigned int u32;
#include STORE_SOURCE
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    FILE* out = fopen(argv[2], "wb");
    if (!in || !out) return 3;
    u32 b;
    while (fread(&b, 4, 1, in) == 1) {
        u16 r[2] = {(u16)f32_to_f16_bits(b), (u16)f32_to_bf16_bits(b)};
        if (fwrite(r, 2, 2, out) != 2) return 4;
    }
    fclose(in);
    return fclose(out) == 0 ? 0 : 5;
}
