/**
 * Deadlines and exec limits on a real node (issue 11 section 1): a CreateSandbox whose
 * `grpc-timeout` ran out before it was handled creates nothing (no record, VM, container or
 * device), and an Exec argument the kernel would refuse (E2BIG) is INVALID_ARGUMENT naming the
 * field and the limit (also a command name or path, or cwd, longer than NAME_MAX / PATH_MAX).
 * A create whose deadline runs out while it runs is undone. The late creates go over raw
 * HTTP/2, so the server really receives a `grpc-timeout` of 1n / 1u / 1m or the ms given (a
 * grpc-js client may fail such a call without sending it).
 */
import http2 from 'node:http2';
import net from 'node:net';
import { Status } from 'nice-grpc-common';
import { CreateSandboxRequest, SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, execCollect, expectCode, inventory, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

/** rawCall sends one request message over the unix socket; resolves with grpc-status. */
function rawCall(socket: string, rpc: string, body: Uint8Array, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const session = http2.connect('http://localhost', { createConnection: () => net.connect(socket) });
    session.on('error', reject);
    const req = session.request({ ':method': 'POST', ':path': rpc, 'content-type': 'application/grpc', te: 'trailers', ...headers });
    let status: number | undefined;
    const take = (h: http2.IncomingHttpHeaders) => {
      if (h['grpc-status'] !== undefined) status = Number(h['grpc-status']);
    };
    req.on('response', take);
    req.on('trailers', take);
    req.on('data', () => undefined);
    req.on('error', reject);
    req.on('close', () => {
      session.close();
      if (status === undefined) reject(new Error(`${rpc}: no grpc-status`));
      else resolve(status);
    });
    const frame = Buffer.alloc(5 + body.length);
    frame.writeUInt32BE(body.length, 1);
    Buffer.from(body).copy(frame, 5);
    req.end(frame);
  });
}

describeNode('deadlines and exec limits on a real node', () => {
  let node: TestNode;
  let socket: string;

  beforeAll(async () => {
    node = await startNode();
    socket = node.address.slice('unix://'.length);
  });
  afterAll(async () => {
    await node?.stop();
  });

  /**
   * nothing: the node converges to no sandbox, VM, device, container or dir, and stays so for a
   * second. A late create may still arrive after its caller gave up (the client's deadline fires
   * locally), and one that began and was undone may have a teardown step retried by the reaper
   * (a device busy right after its VM went): both must end with nothing left.
   */
  const nothing = async () => {
    const state = async () => {
      const inv = await inventory(node.dirs);
      return { sandboxes: (await node.api.sandboxes.listSandboxes({})).sandboxes.map((x) => x.sandboxId), vms: inv.vms, devices: inv.devices, containers: inv.containers, dirs: inv.dirs };
    };
    const empty = { sandboxes: [], vms: [], devices: [], containers: [], dirs: [] };
    let emptySince: number | undefined;
    await waitFor(
      'the node to stay empty for 1 s',
      async () => {
        if (JSON.stringify(await state()) !== JSON.stringify(empty)) {
          emptySince = undefined;
          return false;
        }
        emptySince ??= Date.now();
        return Date.now() - emptySince >= 1000;
      },
      60_000,
      100,
    ).catch(() => undefined);
    expect(await state()).toEqual(empty);
  };

  const CREATE = '/sandnode.server.v1.SandboxService/CreateSandbox';
  const body = CreateSandboxRequest.encode(CreateSandboxRequest.fromPartial({ template: 'base' })).finish();

  it('CreateSandbox with grpc-timeout 1n or 1u (passed on arrival) answers DEADLINE_EXCEEDED and never begins', async () => {
    for (const t of ['1n', '1u', '1n', '1u', '1n', '1u']) {
      expect(await rawCall(socket, CREATE, body, { 'grpc-timeout': t })).toBe(Status.DEADLINE_EXCEEDED);
      // at once: not even a CREATING record was made (a create that began would show one here)
      expect((await node.api.sandboxes.listSandboxes({})).sandboxes).toEqual([]);
    }
    // and nothing shows up later either
    await new Promise((r) => setTimeout(r, 2000));
    await nothing();
  });

  it('CreateSandbox with grpc-timeout 1m answers DEADLINE_EXCEEDED and leaves nothing (refused, or begun and torn down)', async () => {
    for (let i = 0; i < 6; i++) expect(await rawCall(socket, CREATE, body, { 'grpc-timeout': '1m' })).toBe(Status.DEADLINE_EXCEEDED);
    // a create that began within its 1 ms has no request_id: its caller went away, so it is undone
    await waitFor('every late create to be torn down', async () => (await node.api.sandboxes.listSandboxes({})).sandboxes.length === 0, 60_000, 200);
    await nothing();
  });

  it('CreateSandbox through the sandnode client with a deadline 1 ms away creates nothing', async () => {
    await expectCode(node.api.sandboxes.createSandbox({ template: 'base' }, { deadline: new Date(Date.now() + 1) }), Status.DEADLINE_EXCEEDED);
    await nothing();
  });

  it('CreateSandbox whose grpc-timeout runs out during the create (any step, also a podd Health call in flight) leaves nothing; one that answered OK is kept', async () => {
    // how long a create takes on this node, so that the deadlines below fall inside one
    const t0 = Date.now();
    expect(await rawCall(socket, CREATE, body, {})).toBe(Status.OK);
    const createMs = Date.now() - t0;
    await Promise.all((await node.api.sandboxes.listSandboxes({})).sandboxes.map((x) => node.api.sandboxes.deleteSandbox({ sandboxId: x.sandboxId })));
    const answers: number[] = [];
    for (const f of [0.4, 0.55, 0.7, 0.8, 0.9, 1, 1.1, 1.25, 1.4, 1.6, 1.8, 2.2]) {
      answers.push(await rawCall(socket, CREATE, body, { 'grpc-timeout': `${Math.max(1, Math.round(createMs * f))}m` }));
    }
    expect(answers.every((c) => c === Status.OK || c === Status.DEADLINE_EXCEEDED)).toBe(true);
    const ok = answers.filter((c) => c === Status.OK).length;
    // every create that did not answer OK is undone: exactly the OK ones remain, RUNNING
    await waitFor('the late creates to be torn down', async () => (await node.api.sandboxes.listSandboxes({})).sandboxes.length === ok, 60_000, 200);
    await new Promise((r) => setTimeout(r, 1000)); // none shows up late either
    const left = (await node.api.sandboxes.listSandboxes({})).sandboxes;
    expect({ left: left.length, states: [...new Set(left.map((x) => x.state))] }).toEqual({ left: ok, states: ok ? [SandboxState.SANDBOX_STATE_RUNNING] : [] });
    await Promise.all(left.map((x) => node.api.sandboxes.deleteSandbox({ sandboxId: x.sandboxId })));
    await nothing();
  });

  it('Exec of a command name or path longer than NAME_MAX / PATH_MAX, or a 100 KiB cwd, answers INVALID_ARGUMENT naming the field; the sandbox runs on', async () => {
    const id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    await expectCode(execCollect(node.api, id, ['x'.repeat(256)]), Status.INVALID_ARGUMENT, /^argv\[0\]: .* has a 256-byte name, at most 255 per name \(NAME_MAX\)$/);
    await expectCode(execCollect(node.api, id, ['/a'.repeat(2500)]), Status.INVALID_ARGUMENT, /^argv\[0\]: .* 5000 bytes, at most 4095 \(PATH_MAX\)$/);
    await expectCode(execCollect(node.api, id, ['true'], { cwd: `/${'d'.repeat(100 * 1024)}` }), Status.INVALID_ARGUMENT, /^cwd: .* 102401 bytes, at most 4095 \(PATH_MAX\)$/);
    // a name of 255 bytes is only not found
    await expectCode(execCollect(node.api, id, ['x'.repeat(255)]), Status.NOT_FOUND);
    expect(await execCollect(node.api, id, ['true'])).toMatchObject({ exitCode: 0 });
    await node.api.sandboxes.deleteSandbox({ sandboxId: id });
  });

  it('Exec with a 200 KB argument or env value answers INVALID_ARGUMENT naming the field and the limit; the sandbox runs on', async () => {
    const id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
    const big = 'x'.repeat(200 * 1024);
    await expectCode(execCollect(node.api, id, ['echo', big]), Status.INVALID_ARGUMENT, /argv\[1\]: 204800 bytes, at most 131071 per argument/);
    await expectCode(execCollect(node.api, id, ['true'], { env: { BIG: big } }), Status.INVALID_ARGUMENT, /env\[BIG\]: 204804 bytes as KEY=VALUE, at most 131071/);
    const many = Array.from({ length: 9 }, () => 'y'.repeat(120 * 1024));
    await expectCode(execCollect(node.api, id, ['true', ...many]), Status.INVALID_ARGUMENT, /argv \+ env: \d+ bytes, at most 1048576 together/);
    // the largest argument allowed runs
    const r = await execCollect(node.api, id, ['sh', '-c', 'echo ${#1}', 'sh', 'z'.repeat(128 * 1024 - 1)]);
    expect(r).toMatchObject({ exitCode: 0 });
    expect(String(r.stdout).trim()).toBe(String(128 * 1024 - 1));
    expect((await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    await node.api.sandboxes.deleteSandbox({ sandboxId: id });
  });
});
