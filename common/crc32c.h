/* common/crc32c.h — CRC-32C (Castagnoli), the checksum of every record a
 * reader may see torn: wire frames, SSTable records, WAL and manifest records.
 * Uses the SSE4.2 instruction when the CPU has it (three chains at once
 * over buffers of 768 bytes or more: docs/bench.md), else slice-by-8 tables.
 * Thread safe (the tables are built once, under pthread_once). */
#ifndef DKV_CRC32C_H
#define DKV_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend crc (0 to start) over [p, p+n). */
uint32_t crc32c_extend(uint32_t crc, const void *p, size_t n);
static inline uint32_t crc32c(const void *p, size_t n)
{
	return crc32c_extend(0, p, n);
}

/* A stored checksum against the one computed.  Fuzzing builds (make fuzz,
 * -DDKV_FUZZING) accept any, so the fuzzers reach the parsers behind the
 * checksums: a peer can always compute a right one. */
static inline int crc_ok(uint32_t stored, uint32_t computed)
{
#ifdef DKV_FUZZING
	(void)stored;
	(void)computed;
	return 1;
#else
	return stored == computed;
#endif
}

#endif
