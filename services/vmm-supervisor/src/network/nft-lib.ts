/**
 * libnftables through koffi: one context per thread that uses it, each call one transaction
 * (`nft_run_cmd_from_buffer`). Used by the network worker thread (net-worker-main.ts), so
 * that a change never blocks the supervisor's event loop (running it on the main thread instead
 * was not faster here: pool acquire p50 5.2 vs 3.3 ms, 100 each, alternating, load ~24).
 */
import type * as Koffi from 'koffi' with { 'resolution-mode': 'import' };

const koffi = require('koffi') as typeof Koffi;

/** NftLibError: libnftables could not be loaded or gave no context (not installed). */
export class NftLibError extends Error {}

interface Nft {
  ctx: unknown;
  run: (ctx: unknown, text: string) => number;
  err: (ctx: unknown) => string;
  out: (ctx: unknown) => string;
}
let nft: Nft | undefined;

/** nftRun applies text as one transaction on this thread; returns '' or nft's error text. Throws NftLibError when libnftables is not there. */
export function nftRun(text: string): string {
  if (!nft) {
    let l;
    try {
      l = koffi.load('libnftables.so.1');
    } catch (err) {
      throw new NftLibError(`load libnftables.so.1: ${(err as Error).message}`);
    }
    const ctx = (l.func('void *nft_ctx_new(uint32_t flags)') as (f: number) => unknown)(0);
    if (!ctx) throw new NftLibError('nft_ctx_new returned NULL');
    (l.func('int nft_ctx_buffer_error(void *ctx)') as (x: unknown) => number)(ctx);
    (l.func('int nft_ctx_buffer_output(void *ctx)') as (x: unknown) => number)(ctx);
    nft = {
      ctx,
      run: l.func('int nft_run_cmd_from_buffer(void *ctx, const char *buf)') as Nft['run'],
      err: l.func('const char *nft_ctx_get_error_buffer(void *ctx)') as Nft['err'],
      out: l.func('const char *nft_ctx_get_output_buffer(void *ctx)') as Nft['out'],
    };
  }
  const rc = nft.run(nft.ctx, text);
  // always read both buffers: they are memstreams that libnftables rewinds on read (left unread, they crashed the process at exit)
  const err = nft.err(nft.ctx) ?? '';
  nft.out(nft.ctx);
  return rc === 0 ? '' : err.trim() || `nft_run_cmd_from_buffer returned ${rc}`;
}
