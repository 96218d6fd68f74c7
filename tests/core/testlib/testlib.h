/* SPDX-License-Identifier: MIT */
#pragma once
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
uint64_t tl_add(uint64_t a, uint64_t b);
uint64_t tl_mix(uint64_t a, uint64_t b);
uint64_t tl_asm(uint64_t a, uint64_t b);
extern const uint64_t tl_asm_jcc_site, tl_asm_load_site;
#ifdef __cplusplus
}
#endif
