//! A tiny deterministic PRNG for randomised rounds (the crash tests), repeatable by its seed.

/// xorshift64*, seeded from `COURIER_CRASH_SEED` or the clock.
pub struct Rng(pub u64);

impl Rng {
    pub fn from_env() -> Rng {
        let seed = std::env::var("COURIER_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
        eprintln!("random seed {seed} (COURIER_CRASH_SEED={seed} repeats it)");
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}
