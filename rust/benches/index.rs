//! KV-index throughput on one core: event batches ingested (decode + apply),
//! rates per CPU-second of the one thread,
//! lookups of 8k-token prompts (keys computed, tokenization excluded), and
//! heap bytes per held block. Prints one JSON object.
//!
//! Run: `cargo bench --bench index` (release profile). `KV_BENCH_SCALE=0.1`
//! shrinks the work for a quick look.
#![expect(
    clippy::unwrap_used,
    clippy::cast_sign_loss,
    reason = "a benchmark stops on a broken setup; its casts are of small non-negative counts"
)]

#[path = "../tests/kv/msgpack.rs"]
#[expect(dead_code, reason = "the writer is shared by several crates; this one uses a part")]
mod msgpack;

use std::hint::black_box;
use std::time::Instant;

use llmgw_core::kv::{KvConfig, KvIndex};
use msgpack::{batch, stored_arr, stored_map};

const BS: usize = 16;
const PROMPT_BLOCKS: usize = 512; // 8192 tokens
const EVENT_BLOCKS: usize = 16;

/// This thread's time on a CPU (ns), from /proc: the machine the bench runs on
/// may be shared, and a rate per CPU-second is what "on one core" means.
fn cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Wall and CPU clocks together.
struct Clock(Instant, u64);

impl Clock {
    fn start() -> Self {
        Self(Instant::now(), cpu_ns())
    }

    /// (wall seconds, CPU seconds) since start.
    fn secs(&self) -> (f64, f64) {
        let wall = self.0.elapsed().as_secs_f64();
        let cpu = (cpu_ns() - self.1) as f64 / 1e9;
        (wall, if cpu > 0.0 { cpu } else { wall })
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A token id in a 150k vocabulary, as large models have.
    fn token(&mut self) -> u32 {
        (self.next() % 150_000) as u32
    }
}

/// Payloads storing `prompts` as vLLM does: 16-block events, each chained on the last.
fn payloads(prompts: &[Vec<u32>], seed: u64, array: bool) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for p in prompts {
        let mut parent: Option<i128> = None;
        for ev in p.chunks(EVENT_BLOCKS * BS) {
            // Engine hashes as vLLM makes them: of the parent's hash and the
            // block's tokens, so a shared prefix has the same hashes everywhere.
            let mut h = parent.map_or(seed, |p| p as u64);
            let hashes: Vec<i128> = ev
                .chunks(BS)
                .map(|b| {
                    h = b
                        .iter()
                        .fold(h, |h, &t| (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3));
                    i128::from(h)
                })
                .collect();
            let e = if array {
                stored_arr(&hashes, parent, ev, BS as i128)
            } else {
                stored_map(&hashes, parent, ev, BS as i128, None)
            };
            parent = hashes.last().copied();
            out.push(batch(vec![e], Some(0)));
        }
    }
    out
}

fn prompt(rng: &mut Rng, prefix: &[u32]) -> Vec<u32> {
    let mut p = prefix.to_vec();
    while p.len() < PROMPT_BLOCKS * BS {
        p.push(rng.token());
    }
    p
}

/// Ingests `n_blocks` into one replica bounded to `max` blocks; returns (blocks/s, bytes/block).
fn ingest(rng: &mut Rng, n_blocks: usize, max: u32, array: bool) -> (f64, u64, u64) {
    let prompts: Vec<Vec<u32>> = (0..n_blocks / PROMPT_BLOCKS)
        .map(|_| prompt(rng, &[]))
        .collect();
    let pay = payloads(&prompts, rng.next(), array);
    let mut ix = KvIndex::new(KvConfig {
        block_size: BS as u32,
        max_blocks_per_replica: max,
        seed: 0,
    });
    let t = Clock::start();
    for (seq, p) in pay.iter().enumerate() {
        black_box(ix.apply("r0", seq as u64, p).unwrap());
    }
    let (_, secs) = t.secs();
    let s = ix.stats();
    assert_eq!(s.unkeyable, 0);
    (
        (prompts.len() * PROMPT_BLOCKS) as f64 / secs,
        s.bytes_per_block(),
        s.blocks,
    )
}

fn main() {
    let scale: f64 = std::env::var("KV_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let n = |x: f64| ((x * scale) as usize).max(1);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);

    // Ingest: 1M blocks into a replica bounded at 512k (so eviction runs too).
    let (map_rate, bytes_full, held) = ingest(&mut rng, n(1_048_576.0), n(524_288.0) as u32, false);
    let (arr_rate, _, _) = ingest(&mut rng, n(1_048_576.0), n(524_288.0) as u32, true);
    // Memory at a fill that is not a power of two (tables and slab mid-growth).
    let (_, bytes_mid, held_mid) = ingest(&mut rng, n(700_000.0), u32::MAX, false);

    // Lookups: 8 replicas, each holding `per` 8k-token prompts that begin with
    // the same 2k-token system prompt: every lookup matches all 8 replicas
    // (128 blocks) and one of them fully (512 blocks), the hard case.
    let replicas = 8;
    let per = n(100.0);
    let system: Vec<u32> = (0..128 * BS).map(|_| rng.token()).collect();
    let mut ix = KvIndex::new(KvConfig {
        block_size: BS as u32,
        max_blocks_per_replica: 4_000_000,
        seed: 0,
    });
    let mut queries = Vec::new();
    for r in 0..replicas {
        let prompts: Vec<Vec<u32>> = (0..per).map(|_| prompt(&mut rng, &system)).collect();
        for (seq, p) in payloads(&prompts, 7, false).iter().enumerate() {
            ix.apply(&format!("replica-{r}"), seq as u64, p).unwrap();
        }
        queries.extend(prompts);
    }
    // Prompts that only replica-0 holds (no shared prefix): the common case.
    let solo: Vec<Vec<u32>> = (0..64).map(|_| prompt(&mut rng, &[])).collect();
    for (seq, p) in payloads(&solo, 7, false).iter().enumerate() {
        ix.apply("replica-0", (per * 32 + seq) as u64, p).unwrap();
    }
    let misses: Vec<Vec<u32>> = (0..64).map(|_| prompt(&mut rng, &[])).collect();
    let mut out = Vec::new();
    // Every case times the same number of lookups (32,000 at full scale):
    // 2,560 (64 prompts, 40 rounds) took 4 ms, and the CPU clock read from
    // /proc at that length gave figures of exactly 1x or 2x from run to run.
    let lookups = n(32_000.0);
    let time = |qs: &[Vec<u32>], out: &mut Vec<_>| {
        let t = Clock::start();
        let rounds = lookups.div_ceil(qs.len());
        for _ in 0..rounds {
            for q in qs {
                ix.score_into(black_box(q), None, out);
                black_box(&out);
            }
        }
        (rounds * qs.len()) as f64 / t.secs().1
    };
    assert_eq!(ix.stats().unkeyable, 0);
    // The lookups are timed on 64 prompts in every case (2 MB of token ids, 8
    // of each replica's here): in the gateway a lookup follows the prompt's
    // tokenization, so its ids are in cache while the index is not. The same
    // lookups over all `replicas * per` prompts (25 MB at full scale) also
    // time reading the ids from memory, about 1 µs of a lookup's 3; that
    // figure is printed too.
    let hot: Vec<Vec<u32>> = queries
        .iter()
        .step_by((queries.len() / 64).max(1))
        .take(64)
        .cloned()
        .collect();
    let hit_rate = time(&hot, &mut out);
    assert_eq!(out.len(), replicas);
    let streamed_rate = time(&queries, &mut out);
    assert_eq!(out.len(), replicas);
    let solo_rate = time(&solo, &mut out);
    assert_eq!(out.len(), 1);
    let miss_rate = time(&misses, &mut out);
    let t = Clock::start();
    let keys_rounds = n(20_000.0);
    for _ in 0..keys_rounds {
        black_box(ix.block_keys(black_box(&queries[0]), None));
    }
    let (wall, cpu) = t.secs();
    let keys_ns = cpu * 1e9 / keys_rounds as f64;
    let cpu_share = cpu / wall;
    let s = ix.stats();

    println!(
        "{{\"bench\": \"kv_index\", \"block_size\": {BS}, \"blocks_per_event\": {EVENT_BLOCKS}, \
\"ingest_blocks_per_s_map\": {map_rate:.0}, \"ingest_blocks_per_s_array\": {arr_rate:.0}, \
\"bytes_per_block_full\": {bytes_full}, \"held_full\": {held}, \
\"bytes_per_block_mid\": {bytes_mid}, \"held_mid\": {held_mid}, \
\"lookup_replicas\": {replicas}, \"lookup_index_blocks\": {}, \"lookup_prompt_tokens\": {}, \
\"lookups_per_s_hit_all_replicas\": {hit_rate:.0}, \"lookups_per_s_hit_all_replicas_streamed\": {streamed_rate:.0}, \"lookup_queries\": {}, \"lookups_per_s_hit_one_replica\": {solo_rate:.0}, \"lookups_per_s_miss\": {miss_rate:.0}, \
\"keys_512_blocks_ns\": {keys_ns:.0}, \"cpu_share\": {cpu_share:.2}, \"rates\": \"per CPU-second of one thread\", \"lookup_index_bytes_per_block\": {}}}",
        s.blocks,
        PROMPT_BLOCKS * BS,
        hot.len(),
        s.bytes_per_block()
    );
}
