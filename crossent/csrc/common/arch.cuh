// The build's place: the launch's constants and parameter block (params.h, generated), and what the target architecture changes.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <cuda_runtime.h>
#include "../params.h"

namespace {

constexpr int kWarps = kThreads / 32;
// sm_75's code and Blackwell's need more registers a thread than sm_80's to sm_90's (the host's
// policy._more_registers).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
constexpr bool kSm75 = true, kMoreRegisters = true;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr bool kSm75 = false, kMoreRegisters = true;
#else
constexpr bool kSm75 = false, kMoreRegisters = false;
#endif
// CTAs per SM the launch bounds promise room for: kCtasPerSm leaves 85 registers a thread.
constexpr int kResidentCtas = kMoreRegisters ? kCtasPerSmMoreRegisters : kCtasPerSm;
// The one-row kernel's most threads: 64 registers each at 1024, too few for sm_75's code.
constexpr int kOneRowCta = kSm75 ? kOneRowThreadsSm75 : kOneRowThreads;
constexpr float kLog2e = 1.4426950408889634f;

}  // namespace
