// AMX (Advanced Matrix Extensions, Sapphire Rapids and later Xeons) set-up shared by the kernels that use
// its tiles (csrc/gemm_amx.h, csrc/interleaved_amx.h): Linux hands a process the tile state only when asked
// (arch_prctl ARCH_REQ_XCOMP_PERM, once, for every thread), and each thread loads a tile configuration
// before its first tile instruction and releases the tiles after. AMX_TILES is defined where the build has
// AMX-TILE and AMX-BF16 (-march=native on such a CPU).
#pragma once
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dtypes.h"

#define AMX_TILES 1

namespace amx {

constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;  // <asm/prctl.h>, the tile data's state

struct alignas(64) TileConfig {  // palette 1
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t bytes_per_row[16] = {};
    uint8_t rows[16] = {};
};

// whether Linux granted this process the tile state (asked on the first call)
inline bool granted() {
    static const bool ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return ok;
}

// calls' shares run on tiles so far, by every kernel and thread (amx_tile_runs(): the tests' proof that a
// call took them, whose results alone may equal the VDPBF16PS path's)
inline std::atomic<int64_t> runs{0};

// this thread's 8 tiles as 16 rows x 64 bytes: an A tile is 16 rows x 32 bf16, a B tile 16 k-pairs x 16
// columns x 2 bf16, a C tile 16 x 16 fp32
inline void configure() {
    TileConfig config;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = 16;
        config.bytes_per_row[t] = 64;
    }
    _tile_loadconfig(&config);
    runs.fetch_add(1, std::memory_order_relaxed);
}

// x's rows [row, row + block) as tile loads read them (16 whole rows of k each): in place, or where fewer
// than block rows are left (the call's last rows: row == rows / block * block) a copy in tail zeroed past
// them, made once; a tile load would otherwise read past the end of x
inline const BFloat16 *rows_for_tiles(const BFloat16 *x, int64_t rows, int64_t k, int64_t row, int64_t block,
                                      std::vector<BFloat16> &tail) {
    if (row != rows / block * block) return x + row * k;
    if (tail.empty()) {
        tail.assign(size_t(block * k), BFloat16{0});
        std::memcpy(tail.data(), x + row * k, size_t((rows - row) * k) * sizeof(BFloat16));
    }
    return tail.data();
}

}  // namespace amx
#endif
