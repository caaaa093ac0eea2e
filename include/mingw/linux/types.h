/*
 * For building against rdma-core's <infiniband/verbs.h> and
 * <rdma/rdma_cma.h> with MinGW-w64 (Windows x64): the kernel's fixed-size
 * types those headers use. Put this directory first on the include path
 * (docs/ibverbs.md, Windows). Big- and little-endian types are plain
 * integers of their size, as the kernel's are without sparse.
 */
#ifndef IRPVERBS_MINGW_LINUX_TYPES_H
#define IRPVERBS_MINGW_LINUX_TYPES_H

#include <stdint.h>

typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef uint64_t __u64;
typedef int8_t __s8;
typedef int16_t __s16;
typedef int32_t __s32;
typedef int64_t __s64;
typedef uint16_t __le16;
typedef uint32_t __le32;
typedef uint64_t __le64;
typedef uint16_t __be16;
typedef uint32_t __be32;
typedef uint64_t __be64;
typedef uint64_t __attribute__((aligned(8))) __aligned_u64;

#endif
