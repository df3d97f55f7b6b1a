/**
 * Reading host binaries: ELF linkage (static or dynamic) from the program headers, and the
 * shared libraries `ldd` lists, so a template carries what its Node binary needs.
 */
import { open } from 'node:fs/promises';
import { CommandError, FailedPreconditionError, run } from '@sandnode/shared';

/**
 * sharedLibraries returns the absolute paths `ldd` lists for binary (loader included, vdso
 * excluded); [] for a static binary. FailedPreconditionError when ldd is missing or a library is
 * "not found".
 */
export async function sharedLibraries(binary: string): Promise<string[]> {
  let out: string;
  try {
    out = await runHost('ldd', [binary]);
  } catch (err) {
    const msg = (err as Error).message;
    if (/not a dynamic executable|statically linked/.test(msg)) return [];
    if (err instanceof CommandError && /\bENOENT\b/.test(err.message)) throw new FailedPreconditionError('ldd not found: install it with `apt-get install libc-bin`');
    throw err;
  }
  const libs: string[] = [];
  for (const line of out.split('\n')) {
    const l = line.trim();
    if (!l || /statically linked/.test(l)) continue;
    const missing = /^(\S+) => not found/.exec(l);
    if (missing) throw new FailedPreconditionError(`${binary} needs ${missing[1]}, which ldd cannot find`);
    const m = /=>\s+(\/\S+)/.exec(l) ?? /^(\/\S+)/.exec(l);
    if (m?.[1]) libs.push(m[1]);
  }
  return libs;
}

/** elfLinkage reads the ELF program headers: 'dynamic' when there is a PT_INTERP. */
export async function elfLinkage(p: string): Promise<'static' | 'dynamic' | 'not-elf'> {
  const fh = await open(p, 'r');
  try {
    const hdr = Buffer.alloc(64);
    await fh.read(hdr, 0, 64, 0);
    if (hdr.readUInt32BE(0) !== 0x7f454c46) return 'not-elf';
    const is64 = hdr[4] === 2;
    const le = hdr[5] === 1;
    const u16 = (b: Buffer, o: number) => (le ? b.readUInt16LE(o) : b.readUInt16BE(o));
    const u32 = (b: Buffer, o: number) => (le ? b.readUInt32LE(o) : b.readUInt32BE(o));
    const phoff = is64 ? Number(le ? hdr.readBigUInt64LE(0x20) : hdr.readBigUInt64BE(0x20)) : u32(hdr, 0x1c);
    const phentsize = u16(hdr, is64 ? 0x36 : 0x2a);
    const phnum = u16(hdr, is64 ? 0x38 : 0x2c);
    const ph = Buffer.alloc(phentsize * phnum);
    await fh.read(ph, 0, ph.length, phoff);
    for (let i = 0; i < phnum; i++) if (u32(ph, i * phentsize) === 3 /* PT_INTERP */) return 'dynamic';
    return 'static';
  } finally {
    await fh.close();
  }
}

/** How long a host command of the builder (ldd, busybox --list, node --version) may take, ms. */
export const HOST_COMMAND_TIMEOUT_MS = 30_000;

/** runHost runs a host command (no shell) and returns its stdout; CommandError (INTERNAL) naming it on failure. */
export async function runHost(cmd: string, args: string[]): Promise<string> {
  return (await run(cmd, args, { timeoutMs: HOST_COMMAND_TIMEOUT_MS })).stdout;
}
