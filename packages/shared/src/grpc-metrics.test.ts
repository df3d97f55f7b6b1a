/**
 * What a component's /metrics and log lines show after a few calls through createServiceServer
 * and createServiceClient: go-grpc-prometheus names and labels on both sides, build info,
 * unprefixed process metrics, string log levels, and rpc / epoch / sandbox_id on every line
 * logged while a call runs (whichever logger writes it).
 */
import { Writable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { createLogger } from './logger';
import { createSandnodeChannel, createServiceClient } from './client';
import { NotFoundError } from './errors';
import { SandboxServiceDefinition } from './gen/sandnode/server/v1/sandbox';
import { registry } from './metrics';
import { createServiceServer, type ServiceServer } from './server';

const lines: Record<string, unknown>[] = [];
const sink = new Writable({
  write(chunk: Buffer, _enc, cb) {
    for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l) as Record<string, unknown>);
    cb();
  },
});
const log = createLogger('metrics-test', '9.9.9', 'info', sink);
const SVC = 'sandnode.server.v1.SandboxService';

/** value of one sample line `name{labels} value` in the exposition text (undefined: absent). */
function sample(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split('\n')) {
    if (!line.startsWith(`${name}{`)) continue;
    const body = line.slice(name.length + 1, line.lastIndexOf('}'));
    const got = Object.fromEntries([...body.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]));
    if (Object.entries(labels).every(([k, v]) => got[k] === v) && Object.keys(got).length === Object.keys(labels).length) return Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return undefined;
}

describe('gRPC metrics and call log context', () => {
  let server: ServiceServer;
  let text = '';

  beforeAll(async () => {
    server = createServiceServer({ info: { component: 'metrics-test', version: '9.9.9', commit: 'abc123', features: [] }, log, epoch: () => 7 });
    server.add(SandboxServiceDefinition, {
      getSandbox: async (req: { sandboxId: string }) => {
        await sleep(5);
        // the root logger, after an await: the call's fields come from the log context
        log.info('looking it up');
        log.child({ sandbox_id: req.sandboxId }).info('child with its own sandbox_id');
        if (req.sandboxId === 'sb-0000000000000404') throw new NotFoundError('no such sandbox');
        return {};
      },
      exec: async function* () {
        await sleep(1);
        log.info('exec running');
        yield { started: { pid: 1 } };
      },
    } as never);
    const [port] = await server.listen(['127.0.0.1:0']);
    const ch = createSandnodeChannel(`127.0.0.1:${port}`);
    const c = createServiceClient(SandboxServiceDefinition, ch, { retryAttempts: 1 });
    await c.getSandbox({ sandboxId: 'sb-0000000000000001' });
    await expect(c.getSandbox({ sandboxId: 'sb-0000000000000404' })).rejects.toThrow(/no such sandbox/);
    for await (const ev of c.exec({ sandboxId: 'sb-0000000000000002', argv: ['true'] })) void ev;
    ch.close();
    log.info('outside any call');
    text = await registry.metrics();
  });
  afterAll(() => server.shutdown(100));

  it('counts and times served calls with go-grpc-prometheus names and labels', () => {
    const unary = { grpc_type: 'unary', grpc_service: SVC, grpc_method: 'GetSandbox' };
    expect(sample(text, 'grpc_server_started_total', unary)).toBe(2);
    expect(sample(text, 'grpc_server_handled_total', { ...unary, grpc_code: 'OK' })).toBe(1);
    expect(sample(text, 'grpc_server_handled_total', { ...unary, grpc_code: 'NOT_FOUND' })).toBe(1);
    expect(sample(text, 'grpc_server_handling_seconds_count', unary)).toBe(2);
    expect(sample(text, 'grpc_server_handling_seconds_bucket', { ...unary, le: '+Inf' })).toBe(2);
    const stream = { grpc_type: 'server_stream', grpc_service: SVC, grpc_method: 'Exec' };
    expect(sample(text, 'grpc_server_handled_total', { ...stream, grpc_code: 'OK' })).toBe(1);
  });

  it('counts and times client calls the same way', () => {
    const unary = { grpc_type: 'unary', grpc_service: SVC, grpc_method: 'GetSandbox' };
    expect(sample(text, 'grpc_client_started_total', unary)).toBe(2);
    expect(sample(text, 'grpc_client_handled_total', { ...unary, grpc_code: 'NOT_FOUND' })).toBe(1);
    expect(sample(text, 'grpc_client_handling_seconds_count', unary)).toBe(2);
    expect(sample(text, 'grpc_client_handled_total', { grpc_type: 'server_stream', grpc_service: SVC, grpc_method: 'Exec', grpc_code: 'OK' })).toBe(1);
  });

  it('shows build info and unprefixed process metrics; the old rpc histogram is gone', () => {
    expect(sample(text, 'sandnode_build_info', { component: 'metrics-test', version: '9.9.9', commit: 'abc123', node_id: '', runtime: `node ${process.versions.node}` })).toBe(1);
    expect(text).toMatch(/^process_cpu_user_seconds_total /m);
    expect(text).toMatch(/^nodejs_eventloop_lag_seconds /m);
    expect(text).not.toMatch(/^sandnode_process_|^sandnode_nodejs_|sandnode_rpc_duration_seconds/m);
  });

  it('writes string levels, and rpc, epoch and sandbox_id on every line logged during a call', () => {
    expect(lines.length).toBeGreaterThanOrEqual(6);
    expect(lines.every((l) => typeof l.level === 'string')).toBe(true);
    const lookups = lines.filter((l) => l.msg === 'looking it up');
    expect(lookups.map((l) => [l.level, l.rpc, l.epoch, l.sandbox_id])).toEqual([
      ['info', `/${SVC}/GetSandbox`, 7, 'sb-0000000000000001'],
      ['info', `/${SVC}/GetSandbox`, 7, 'sb-0000000000000404'],
    ]);
    const exec = lines.find((l) => l.msg === 'exec running');
    expect([exec?.rpc, exec?.epoch, exec?.sandbox_id]).toEqual([`/${SVC}/Exec`, 7, 'sb-0000000000000002']);
    // a child that binds sandbox_id itself gets rpc and epoch, and no second sandbox_id key
    const child = lines.find((l) => l.msg === 'child with its own sandbox_id');
    expect([child?.rpc, child?.epoch, child?.sandbox_id]).toEqual([`/${SVC}/GetSandbox`, 7, 'sb-0000000000000001']);
    const outside = lines.find((l) => l.msg === 'outside any call');
    expect(outside && ['rpc', 'epoch', 'sandbox_id'].filter((k) => k in outside)).toEqual([]);
  });
});
