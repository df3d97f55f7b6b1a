/**
 * MetricsEndpoint: a port in use is reported (log + status file) and never fatal; the endpoint
 * binds once the holder frees it (the handover case); close frees the port.
 */
import http from 'node:http';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { createLogger } from './logger';
import { MetricsEndpoint, readMetricsStatus } from './metrics-endpoint';

function get(port: number): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    http
      .get({ host: '127.0.0.1', port, path: '/metrics' }, (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on('error', reject);
  });
}

async function until(what: string, fn: () => boolean | Promise<boolean>): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if (await fn()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

describe('MetricsEndpoint', () => {
  let runDir: string;
  const lines: { level: string; msg: string }[] = [];
  const log = createLogger(
    'test',
    '0',
    'info',
    new Writable({
      write(chunk: Buffer, _e, cb) {
        for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l) as { level: string; msg: string });
        cb();
      },
    }),
  );
  beforeEach(() => (runDir = mkdtempSync(path.join(os.tmpdir(), 'metrics-ep-'))));
  afterEach(() => rmSync(runDir, { recursive: true, force: true }));

  it('reports a port in use, keeps trying, binds once it is freed and writes the URL; close frees it', async () => {
    const holder = net.createServer();
    await new Promise<void>((r) => holder.listen({ host: '127.0.0.1', port: 0 }, () => r()));
    const port = (holder.address() as net.AddressInfo).port;
    const m = new MetricsEndpoint({ listen: `127.0.0.1:${port}`, component: 'server', runDir, log });
    await m.start(); // resolves although the port is taken
    expect(m.url).toBeUndefined();
    expect(readMetricsStatus(runDir, 'server')).toMatchObject({ listen: `127.0.0.1:${port}`, url: null, pid: process.pid, error: expect.stringMatching(/in use \(EADDRINUSE\); retrying/) });
    expect(lines.some((l) => l.level === 'error' && /cannot serve \/metrics: .*in use.*gRPC is served all the same/.test(l.msg))).toBe(true);
    await new Promise<void>((r) => holder.close(() => r()));
    await until('the endpoint to bind the freed port', () => m.url !== undefined);
    expect(readMetricsStatus(runDir, 'server')).toMatchObject({ url: `http://127.0.0.1:${port}/metrics`, error: null });
    const r = await get(port);
    expect(r.status).toBe(200);
    expect(r.body).toMatch(/^process_cpu_user_seconds_total /m);
    await m.start(); // already started: a no-op
    await m.close();
    await expect(get(port)).rejects.toThrow(/ECONNREFUSED/);
  });

  it('is disabled by an empty address and removes a status file an earlier process left', async () => {
    const before = new MetricsEndpoint({ listen: '127.0.0.1:0', component: 'server', runDir, log });
    await before.start();
    expect(readMetricsStatus(runDir, 'server')?.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
    await before.close();
    const m = new MetricsEndpoint({ listen: '', component: 'server', runDir, log });
    await m.start();
    expect(readMetricsStatus(runDir, 'server')).toBeUndefined();
    await m.close();
  });
});
