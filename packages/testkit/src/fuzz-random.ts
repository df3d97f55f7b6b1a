/**
 * seededRandom: the one deterministic PRNG (mulberry32) of the seeded fuzz tests (store fuzz,
 * wire fuzz), so that a failing seed reproduces (tests name the seed in their failure message).
 */

/** Rng draws from one seed; the same seed always gives the same sequence. */
export interface Rng {
  readonly seed: number;
  /** next is a float in [0, 1). */
  next(): number;
  /** int is an integer in [lo, hi] (both included). */
  int(lo: number, hi: number): number;
  /** below is an integer in [0, n). */
  below(n: number): number;
  /** pick is one element of xs (xs not empty). */
  pick<T>(xs: readonly T[]): T;
  /** bytes is n random bytes. */
  bytes(n: number): Buffer;
  /** chance is true with probability p (0..1). */
  chance(p: number): boolean;
}

/** seededRandom returns the Rng of seed (any 32-bit integer). */
export function seededRandom(seed: number): Rng {
  let a = seed >>> 0;
  const next = (): number => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo: number, hi: number): number => lo + Math.floor(next() * (hi - lo + 1));
  return {
    seed,
    next,
    int,
    below: (n: number) => Math.floor(next() * n),
    pick: <T>(xs: readonly T[]): T => xs[int(0, xs.length - 1)] as T,
    bytes: (n: number) => Buffer.from(Array.from({ length: n }, () => int(0, 255))),
    chance: (p: number) => next() < p,
  };
}
