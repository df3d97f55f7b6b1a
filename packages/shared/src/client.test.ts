import { createServer, ServerError, Status, type Server } from 'nice-grpc';
import { SandboxServiceDefinition, type SandboxServiceImplementation } from './gen/sandnode/server/v1/sandbox';
import { createSandnodeChannel, createServiceClient, requestIdMethods } from './client';

/**
 * A create without request_id is sent exactly once (even on UNAVAILABLE, although the proto
 * marks CreateSandbox IDEMPOTENT); with one it is retried until it succeeds. ForkSandbox the
 * same (not marked in the proto: its request_id makes it retryable).
 */
describe('request_id decides whether a create is retried', () => {
  let server: Server;
  let port: number;
  const calls: Record<string, number> = { createSandbox: 0, forkSandbox: 0, setTimeout: 0 };
  let failFirst = 0;

  const fail = (name: string) => {
    calls[name] = (calls[name] ?? 0) + 1;
    if (calls[name]! <= failFirst) throw new ServerError(Status.UNAVAILABLE, 'restarting');
  };

  beforeAll(async () => {
    server = createServer();
    const impl: Record<string, unknown> = {};
    for (const name of Object.keys(SandboxServiceDefinition.methods)) {
      impl[name] = async () => {
        throw new ServerError(Status.UNIMPLEMENTED, name);
      };
    }
    for (const name of ['createSandbox', 'forkSandbox', 'setTimeout']) impl[name] = async () => (fail(name), {});
    server.add(SandboxServiceDefinition, impl as unknown as SandboxServiceImplementation);
    port = await server.listen('127.0.0.1:0');
  });
  afterAll(async () => server.shutdown());
  beforeEach(() => {
    for (const k of Object.keys(calls)) calls[k] = 0;
    failFirst = 2;
  });

  const client = () => createServiceClient(SandboxServiceDefinition, createSandnodeChannel(`127.0.0.1:${port}`), { retryAttempts: 5 });

  it('lists the methods keyed by request_id', () => {
    expect([...requestIdMethods(SandboxServiceDefinition)].sort()).toEqual(['/sandnode.server.v1.SandboxService/CreateSandbox', '/sandnode.server.v1.SandboxService/ForkSandbox']);
  });

  it('CreateSandbox without request_id: one attempt, UNAVAILABLE reaches the caller', async () => {
    await expect(client().createSandbox({ template: 'base' })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    await expect(client().createSandbox({ template: 'base', requestId: '' }, { retry: true })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    expect(calls.createSandbox).toBe(2);
  });

  it('CreateSandbox with request_id: retried until it succeeds', async () => {
    await expect(client().createSandbox({ template: 'base', requestId: 'r-1' })).resolves.toBeDefined();
    expect(calls.createSandbox).toBe(3);
  });

  it('CreateSandbox with request_id and retry: false: one attempt', async () => {
    await expect(client().createSandbox({ template: 'base', requestId: 'r-2' }, { retry: false })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    expect(calls.createSandbox).toBe(1);
  });

  it('ForkSandbox: once without request_id, retried with one', async () => {
    await expect(client().forkSandbox({ parentId: 'sb-0000000000000000' })).rejects.toMatchObject({ code: Status.UNAVAILABLE });
    expect(calls.forkSandbox).toBe(1);
    calls.forkSandbox = 0;
    await expect(client().forkSandbox({ parentId: 'sb-0000000000000000', requestId: 'f-1' })).resolves.toBeDefined();
    expect(calls.forkSandbox).toBe(3);
  });

  it('other idempotent methods are retried as before', async () => {
    await expect(client().setTimeout({ sandboxId: 'sb-0000000000000000' })).resolves.toBeDefined();
    expect(calls.setTimeout).toBe(3);
  });
});
