// ll.cuh: the one-launch path for small device calls (`topoccl_ll_<t>`, one kernel per
// datatype). A rank's whole part of a small collective — its program of the schedule IR, as
// the host lowered it (src/exec/resident/ll.rs) — runs in one kernel: data goes straight into
// the peers' windows as LL lines (NCCL's low-latency protocol: each 8-byte store carries 4
// bytes of data and a 4-byte flag, so a reader that sees the flag has the data, with no fence
// and no separate signal), and every wait is a poll of this rank's own memory.
//
// One block runs a call, its threads together through the steps: each thread takes every
// `threads`-th 8-byte unit of a step, and a barrier (__syncthreads) ends each step, so a step
// reads what any thread of the steps before it wrote, whatever ranges the schedule uses. The
// host build (host_shim.h) runs the block's threads as coroutines that switch at a barrier or
// a wait.
//
// Flags: a call's flag for the lines it sends a peer is the pair's count of such calls, this
// one included; for the lines it receives, the count of calls receiving from the peer. The
// counts live on the device, in the header of this rank's area for the peer (LL_SENT,
// LL_RECEIVED): each call reads them at its start and thread 0 stores them advanced at its
// end, so a kernel replayed from a CUDA graph, whose arguments never change, still runs each
// time as the next call of the pair, and captured and uncaptured calls mix.
//
// Flow control: the receiver's area for one peer holds two parities of lines (call parity =
// flag & 1). Before anything is written into a peer's area the block waits until that peer
// has acknowledged call s - 2 (the same parity); once every read of a call is done, thread 0
// writes the acknowledgement into the writer's own memory, then (where the call has one) the
// call's ticket into the binding's pinned completion word.
//
// Abort: every wait also polls the communicator's abort word (pinned host memory); once the
// host sets it (a peer died, a timeout, an abort), waits give up (every thread still reaches
// every barrier), the kernel writes no acknowledgement and no ticket, and the host completes
// the call with its error.

#define TOPOCCL_LL_PEERS 7
#define TOPOCCL_LL_STEPS 112
#define TOPOCCL_LL_REGIONS (5 + 2 * TOPOCCL_LL_PEERS)

// Regions: the call's buffers, the communicator's completion word and abort word, then per
// peer slot i the peer's area as this device writes it (5 + 2i, "tx") and this rank's area
// the peer writes (6 + 2i, "rx").
enum { LL_INPUT = 0, LL_OUTPUT = 1, LL_SCRATCH = 2, LL_TICKET = 3, LL_ABORT = 4, LL_PEER0 = 5 };
enum { LL_COPY = 0, LL_REDUCE = 1, LL_DIVIDE = 2 };
// An area: the peer's acknowledgement of this rank's calls at byte 0, then (in this rank's
// own area for the peer) the pair's counts of calls that sent the peer lines and that
// received its lines; lines from byte 4096 (two parities).
enum { LL_ACK = 0, LL_SENT = 8, LL_RECEIVED = 12, LL_HEADER = 4096 };

struct topoccl_ll_region {
  u64 ptr;
  u64 len;  // bytes (an area: its whole length)
};
struct topoccl_ll_operand {
  u32 off;  // bytes into the region (an area: data bytes into this call's parity)
  u32 region;
};
struct topoccl_ll_step {
  u32 kind;
  u32 len;  // bytes
  topoccl_ll_operand dst, a, b;
};
struct topoccl_ll_args {
  topoccl_ll_region regions[TOPOCCL_LL_REGIONS];
  u32 steps;
  u32 op;        // 0 sum, 1 prod, 2 min, 3 max
  u32 divisor;   // LL_DIVIDE's n
  u32 prescale;  // 1: what is read from LL_INPUT is first multiplied by `scalar` (PreMulSum)
  u32 ticket;    // written into LL_TICKET when the call ends (none where that region is 0)
  u32 line_bytes;  // bytes of lines per parity in an area
  u32 active;      // bit i: the call sends to slot i; bit 8 + i: it receives from slot i
  u64 scalar;    // PreMulSum's scalar: its bits in the low bytes
  topoccl_ll_step step[TOPOCCL_LL_STEPS];
};
static_assert(sizeof(topoccl_ll_args) == 3928, "topoccl_ll_args is a fixed ABI (LlArgs, src/exec/resident/ll.rs)");

#ifdef TOPOCCL_HOST_BUILD
TOPOCCL_FN void ll_barrier() { topoccl_host_syncthreads(); }
TOPOCCL_FN void ll_fence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
TOPOCCL_FN void ll_pause(u32) { topoccl_host_yield(); }
#else
TOPOCCL_FN void ll_barrier() { __syncthreads(); }
TOPOCCL_FN void ll_fence_system() { __threadfence_system(); }
TOPOCCL_FN void ll_pause(u32 round) {
  if (round > 1024) __nanosleep(100);
}
#endif

// Whether counter `now` has reached `value`, both wrapping (as src/exec/resident `reached`).
TOPOCCL_FN bool ll_reached(u32 now, u32 value) { return (int)(now - value) >= 0; }

TOPOCCL_FN bool ll_aborted(const topoccl_ll_args& args) {
  return *(volatile const u32*)args.regions[LL_ABORT].ptr != 0;
}

// Region r is a peer's area this device writes (tx) or this rank's area a peer writes (rx).
TOPOCCL_FN bool ll_is_tx(u32 r) { return r >= LL_PEER0 && ((r - LL_PEER0) & 1) == 0; }
TOPOCCL_FN bool ll_is_rx(u32 r) { return r >= LL_PEER0 && ((r - LL_PEER0) & 1) == 1; }
TOPOCCL_FN u32 ll_slot(u32 r) { return (r - LL_PEER0) >> 1; }
// The line flag of a call: never 0, which is what a fresh area holds.
TOPOCCL_FN u32 ll_line_flag(u32 flag) { return flag | 0x80000000u; }

// Whether `len` bytes at `off` of operand `o` lie inside its region (an area: inside one
// parity's lines, each 8 data bytes taking a 16-byte line).
TOPOCCL_FN bool ll_inside(const topoccl_ll_args& args, topoccl_ll_operand o, u32 len) {
  if (o.region >= TOPOCCL_LL_REGIONS || args.regions[o.region].ptr == 0) return false;
  const u64 end = (u64)o.off + len;
  if (o.region >= LL_PEER0) {
    const u64 lines = (u64)LL_HEADER + 2ull * args.line_bytes;
    return (o.off & 7) == 0 && 2 * ((end + 7) & ~7ull) <= args.line_bytes && lines <= args.regions[o.region].len;
  }
  return end <= args.regions[o.region].len;
}

// This call's flags per peer slot (from the device counts, module comment).
struct topoccl_ll_flags {
  u32 out[TOPOCCL_LL_PEERS];
  u32 in[TOPOCCL_LL_PEERS];
};

// The counts word `at` of this rank's area for slot i.
TOPOCCL_FN volatile u32* ll_count(const topoccl_ll_args& args, u32 i, u32 at) {
  return (volatile u32*)(args.regions[LL_PEER0 + 2 * i + 1].ptr + at);
}

TOPOCCL_FN void ll_read_flags(const topoccl_ll_args& args, topoccl_ll_flags* f) {
  for (u32 i = 0; i < TOPOCCL_LL_PEERS; ++i) {
    const bool there = args.regions[LL_PEER0 + 2 * i + 1].ptr != 0;
    f->out[i] = there ? *ll_count(args, i, LL_SENT) + 1 : 0;
    f->in[i] = there ? *ll_count(args, i, LL_RECEIVED) + 1 : 0;
  }
}

// The first of unit `u`'s two lines in an area, for a call of `flag`.
TOPOCCL_FN volatile u64* ll_line(const topoccl_ll_args& args, topoccl_ll_operand o, u32 flag, u64 u) {
  const u64 parity = flag & 1;
  return (volatile u64*)(args.regions[o.region].ptr + LL_HEADER + parity * args.line_bytes + 2ull * o.off + 16 * u);
}

// Unit `u` of operand `o` (`n` bytes of it, the rest zero); false if the call was aborted.
template <class S>
TOPOCCL_FN bool ll_load(const topoccl_ll_args& args, const topoccl_ll_flags& flags, topoccl_ll_operand o, u64 u, u32 n,
                        u64* out) {
  if (ll_is_rx(o.region)) {
    const u32 flag = flags.in[ll_slot(o.region)];
    const u32 want = ll_line_flag(flag);
    volatile u64* line = ll_line(args, o, flag, u);
    u64 w0, w1;
    for (u32 round = 0;; ++round) {
      w0 = line[0];
      w1 = line[1];
      if ((u32)(w0 >> 32) == want && (u32)(w1 >> 32) == want) break;
      if ((round & 255) == 255 && ll_aborted(args)) return false;
      ll_pause(round);
    }
    *out = (w0 & 0xffffffffull) | (w1 << 32);
  } else {
    const u8* p = (const u8*)args.regions[o.region].ptr + o.off + 8 * u;
    if (n == 8 && ((u64)p & 7) == 0) {
      *out = *(const u64*)p;
    } else {
      u64 v = 0;
      for (u32 i = 0; i < n; ++i) v |= (u64)p[i] << (8 * i);
      *out = v;
    }
  }
  if (o.region == LL_INPUT && args.prescale) {
    union {
      u64 bits;
      S e[8 / sizeof(S)];
    } x;
    x.bits = *out;
    const typename Elem<S>::W s = Elem<S>::widen(scalar_as<S>(args.scalar));
    for (u32 j = 0; j < n / sizeof(S); ++j) x.e[j] = Elem<S>::narrow(op_prod(Elem<S>::widen(x.e[j]), s));
    *out = x.bits;
  }
  return true;
}

// Stores `n` bytes of unit `u` of operand `o`.
TOPOCCL_FN void ll_store(const topoccl_ll_args& args, const topoccl_ll_flags& flags, topoccl_ll_operand o, u64 u, u32 n,
                         u64 v) {
  if (ll_is_tx(o.region)) {
    const u32 flag = flags.out[ll_slot(o.region)];
    const u64 f = (u64)ll_line_flag(flag) << 32;
    volatile u64* line = ll_line(args, o, flag, u);
    line[0] = (v & 0xffffffffull) | f;
    line[1] = (v >> 32) | f;
    return;
  }
  u8* p = (u8*)args.regions[o.region].ptr + o.off + 8 * u;
  if (n == 8 && ((u64)p & 7) == 0) {
    *(u64*)p = v;
  } else {
    for (u32 i = 0; i < n; ++i) p[i] = (u8)(v >> (8 * i));
  }
}

template <class S>
TOPOCCL_FN S ll_op(u32 op, S a, S b) {
  typedef typename Elem<S>::W W;
  const W x = Elem<S>::widen(a), y = Elem<S>::widen(b);
  switch (op) {
    case 1: return Elem<S>::narrow(OpProd::apply(x, y));
    case 2: return Elem<S>::narrow(OpMin::apply(x, y));
    case 3: return Elem<S>::narrow(OpMax::apply(x, y));
    default: return Elem<S>::narrow(OpSum::apply(x, y));
  }
}

// One unit of one step; false if the call was aborted.
template <class S>
TOPOCCL_FN bool ll_unit(const topoccl_ll_args& args, const topoccl_ll_flags& flags, const topoccl_ll_step& st, u64 u) {
  const u32 n = st.len - 8 * (u32)u < 8 ? st.len - 8 * (u32)u : 8;
  union {
    u64 bits;
    S e[8 / sizeof(S)];
  } x, y;
  if (!ll_load<S>(args, flags, st.a, u, n, &x.bits)) return false;
  if (st.kind == LL_REDUCE) {
    if (!ll_load<S>(args, flags, st.b, u, n, &y.bits)) return false;
    for (u32 j = 0; j < n / sizeof(S); ++j) x.e[j] = ll_op<S>(args.op, x.e[j], y.e[j]);
  } else if (st.kind == LL_DIVIDE) {
    for (u32 j = 0; j < n / sizeof(S); ++j) x.e[j] = Elem<S>::narrow(op_div(Elem<S>::widen(x.e[j]), args.divisor));
  }
  ll_store(args, flags, st.dst, u, n, x.bits);
  return true;
}

template <class S>
TOPOCCL_FN void ll_program(const topoccl_ll_args& args) {
  // One block: the barriers are the block's (a launch of more runs block 0 alone).
  if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0) return;
  const u32 me = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const u32 threads = blockDim.x * blockDim.y * blockDim.z;
  bool aborted = false;
  // Every thread reads the counts before the first barrier; thread 0 stores them advanced
  // only after the last.
  topoccl_ll_flags flags;
  ll_read_flags(args, &flags);
  // The same parity's lines in each peer's area must have been read (call s - 2).
  if (me == 0) {
    for (u32 i = 0; i < TOPOCCL_LL_PEERS && !aborted; ++i) {
      const u32 s = flags.out[i];
      if (((args.active >> i) & 1) == 0 || args.regions[LL_PEER0 + 2 * i + 1].ptr == 0) continue;
      volatile const u32* ack = (volatile const u32*)(args.regions[LL_PEER0 + 2 * i + 1].ptr + LL_ACK);
      for (u32 round = 0; !ll_reached(*ack, s - 2); ++round) {
        if ((round & 255) == 255 && ll_aborted(args)) {
          aborted = true;
          break;
        }
        ll_pause(round);
      }
    }
  }
  ll_barrier();
  const u32 steps = args.steps < TOPOCCL_LL_STEPS ? args.steps : TOPOCCL_LL_STEPS;
  for (u32 k = 0; k < steps; ++k) {
    const topoccl_ll_step& st = args.step[k];
    // The host proved every range inside its region; a step that is not is skipped whole
    // rather than touch memory outside.
    const bool reads_b = st.kind == LL_REDUCE;
    const bool inside = ll_inside(args, st.dst, st.len) && ll_inside(args, st.a, st.len) &&
                        (!reads_b || ll_inside(args, st.b, st.len)) && (st.len % sizeof(S) == 0 || st.kind == LL_COPY);
    for (u32 u = me; inside && !aborted && 8 * (u64)u < st.len; u += threads) {
      if (!ll_unit<S>(args, flags, st, u)) aborted = true;
    }
    ll_barrier();
  }
  // Every read of the call is done: acknowledge the peers' lines, advance the pair counts,
  // then end the call.
  if (me == 0 && !aborted && !ll_aborted(args)) {
    ll_fence_system();
    for (u32 i = 0; i < TOPOCCL_LL_PEERS; ++i) {
      const u64 tx = args.regions[LL_PEER0 + 2 * i].ptr;
      if (((args.active >> (8 + i)) & 1) == 0 || tx == 0) continue;
      *(volatile u32*)(tx + LL_ACK) = flags.in[i];
    }
    for (u32 i = 0; i < TOPOCCL_LL_PEERS; ++i) {
      if (args.regions[LL_PEER0 + 2 * i + 1].ptr == 0) continue;
      if ((args.active >> i) & 1) *ll_count(args, i, LL_SENT) = flags.out[i];
      if ((args.active >> (8 + i)) & 1) *ll_count(args, i, LL_RECEIVED) = flags.in[i];
    }
    ll_fence_system();
    if (args.regions[LL_TICKET].ptr != 0) *(volatile u32*)args.regions[LL_TICKET].ptr = args.ticket;
  }
}

#define TOPOCCL_LL_KERNELS(X) \
  X(i8, i8)                   \
  X(u8, u8)                   \
  X(i32, i32)                 \
  X(u32, u32)                 \
  X(i64, i64)                 \
  X(u64, u64)                 \
  X(f16, f16_t)               \
  X(f32, float)               \
  X(f64, double)              \
  X(bf16, bf16_t)             \
  X(f8e4m3, e4m3_t)           \
  X(f8e5m2, e5m2_t)

#define TOPOCCL_LL_DEFINE(t, S) \
  extern "C" __global__ void topoccl_ll_##t(topoccl_ll_args args) { ll_program<S>(args); }
TOPOCCL_LL_KERNELS(TOPOCCL_LL_DEFINE)
#undef TOPOCCL_LL_DEFINE
