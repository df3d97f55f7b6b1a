/**
 * Helpers of the freeze-port attack test: raw HTTP/2 streams a hostile sandbox could send to
 * its freeze port (node:http2, no gRPC client: an attacker does not follow the rules), and a
 * count of the host processes a supervisor starts while something runs (strace(1) -f on it).
 */
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import http2 from 'node:http2';
import net from 'node:net';
import type { Part } from '@sandnode/testkit';
import { waitFor } from '@sandnode/testkit';

/** The FreezeFilesystems path on the wire. */
export const FREEZE_PATH = '/sandnode.vmm.v1.FreezePortService/FreezeFilesystems';

/** How one raw stream ended. */
export interface StreamEnd {
  /** grpc-status of the answer (trailers or trailers-only headers); undefined when none came. */
  grpcStatus: number | undefined;
  /** The HTTP/2 RST_STREAM code, 0 when none. */
  rstCode: number;
  /** Every header and trailer the server sent. */
  headers: Record<string, string>;
  /** The stream or its connection failed (refused, closed). */
  failed: boolean;
}

/** RawStream is one stream opened on its own connection, still running or ended. */
export interface RawStream {
  /** Resolves once the server answered it (a grpc-status; the attacker may go on sending) or it was closed. */
  ended: Promise<StreamEnd>;
  /** Whether it has ended so. */
  done(): boolean;
  close(): void;
  /** The session's SETTINGS_MAX_CONCURRENT_STREAMS as the server sent it (undefined until settings came). */
  maxConcurrentStreams(): number | undefined;
}

/**
 * openRawStream connects to socketPath, opens one POST stream on path and writes body
 * (e.g. the 5-byte gRPC header of a 4 MiB message and part of it), never ending it when
 * endStream is false.
 */
export function openRawStream(socketPath: string, path: string, body: Buffer, endStream: boolean): RawStream {
  const session = http2.connect('http://localhost', { createConnection: () => net.createConnection(socketPath) });
  const headers: Record<string, string> = {};
  let done = false;
  let failed = false;
  session.on('error', () => (failed = true));
  const st = session.request({ ':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers' }, { endStream: false });
  const ended = new Promise<StreamEnd>((resolve) => {
    const end = () => {
      done = true;
      const s = headers['grpc-status'];
      resolve({ grpcStatus: s === undefined ? undefined : Number(s), rstCode: st.rstCode ?? 0, headers, failed });
    };
    const take = (h: http2.IncomingHttpHeaders) => {
      for (const [k, v] of Object.entries(h)) if (v !== undefined) headers[k] = String(v);
      if (headers['grpc-status'] !== undefined) end();
    };
    st.on('response', take);
    st.on('trailers', take);
    st.on('close', end);
  });
  st.on('error', () => (failed = true));
  st.on('data', () => undefined);
  st.write(body);
  if (endStream) st.end();
  return {
    ended,
    done: () => done,
    close: () => session.destroy(),
    maxConcurrentStreams: () => (session.remoteSettings as { maxConcurrentStreams?: number } | undefined)?.maxConcurrentStreams,
  };
}

/** grpcFrame is one length-prefixed gRPC message: 5-byte header declaring declaredBytes, then payload. */
export function grpcFrame(declaredBytes: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(5);
  h.writeUInt32BE(declaredBytes, 1);
  return Buffer.concat([h, payload]);
}

/** STRACE: the part the process count needs (the CI image does not install it: a skip there). */
export const STRACE: Part = { name: 'strace (apt-get install strace)', present: () => which('strace'), ciProvides: false };

function which(cmd: string): boolean {
  return spawnSync('/bin/sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

/**
 * countSpawns runs fn while strace(1) follows pid (all its threads, and every child it
 * starts), and returns the host processes started meanwhile: execve(2) calls and clones that
 * are not threads.
 */
export async function countSpawns(pid: number, fn: () => Promise<void>): Promise<{ execs: number; forks: number; lines: string[] }> {
  const out: string[] = [];
  const tracer = spawn('strace', ['-f', '-qq', '-e', 'trace=execve,clone,clone3,fork,vfork', '-e', 'signal=none', '-p', String(pid)], { stdio: ['ignore', 'ignore', 'pipe'] });
  let buf = '';
  tracer.stderr.on('data', (d: Buffer) => {
    buf += d.toString();
    const parts = buf.split('\n');
    buf = parts.pop() ?? '';
    out.push(...parts);
  });
  // strace says nothing once attached (-qq): wait until the tracee shows a tracer
  await waitFor('strace to attach', () => /TracerPid:\s+[1-9]/.test(readFileSync(`/proc/${pid}/status`, 'utf8')));
  try {
    await fn();
  } finally {
    tracer.kill('SIGINT');
    await new Promise((r) => tracer.once('exit', r));
  }
  if (buf) out.push(buf);
  const execs = out.filter((l) => /execve\(/.test(l) && !/resumed/.test(l)).length;
  const forks = out.filter((l) => /\b(clone3?|v?fork)\(/.test(l) && !/CLONE_THREAD/.test(l) && !/resumed/.test(l)).length;
  return { execs, forks, lines: out };
}
