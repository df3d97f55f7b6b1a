import { InternalError, Status } from '@sandnode/shared';
import { ClientError } from 'nice-grpc';
import { mapPeerError, withMappedErrors } from './peer-errors';

const STDERR = 'losetup: /var/lib/sandnode/images/x.img: failed to set up loop device: Permission denied';

describe('peer errors', () => {
  it('INTERNAL and UNKNOWN become InternalError naming peer and rpc only; the peer text goes to the log', () => {
    const logged: unknown[] = [];
    const log = { warn: (o: unknown) => logged.push(o) } as never;
    for (const code of [Status.INTERNAL, Status.UNKNOWN, Status.DATA_LOSS]) {
      const got = mapPeerError('ublk-manager', 'createDevice', new ClientError('/sandnode.ublk.v1.DeviceService/CreateDevice', code, STDERR), log);
      expect(got).toBeInstanceOf(InternalError);
      expect((got as Error).message).toBe(`ublk-manager createDevice failed (${Status[code]}); the server log has the details`);
      expect((got as Error).message).not.toContain('losetup');
    }
    expect(logged).toHaveLength(3);
    expect(JSON.stringify((logged[0] as { err: ClientError }).err.details)).toContain('losetup');
  });

  it('codes with a stable meaning keep code and message (UNAVAILABLE stays retryable)', () => {
    for (const code of [Status.NOT_FOUND, Status.INVALID_ARGUMENT, Status.FAILED_PRECONDITION, Status.ABORTED, Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.DEADLINE_EXCEEDED]) {
      const got = mapPeerError('vmm-supervisor', 'getVm', new ClientError('/x/Y', code, 'vm sb-1 not found'));
      expect(got).toMatchObject({ code, message: 'vm sb-1 not found' });
    }
  });

  it("a podd that does not answer is named as the sandbox's podd (UNAVAILABLE, DEADLINE_EXCEEDED keep their code), once", () => {
    for (const code of [Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED]) {
      const got = mapPeerError('podd', 'exec', new ClientError('/podd.v1.PoddService/Exec', code, 'Connection attempt timed out after 20000ms'));
      expect(got).toMatchObject({ code, message: "the sandbox's podd did not answer exec: Connection attempt timed out after 20000ms" });
    }
    const twice = new ClientError('/podd.v1.PoddService/Exec', Status.UNAVAILABLE, 'Protocol error');
    mapPeerError('podd', 'exec', twice);
    expect(mapPeerError('podd', 'exec', twice)).toMatchObject({ message: "the sandbox's podd did not answer exec: Protocol error" });
    // what podd says with another code is podd's words, as before
    expect(mapPeerError('podd', 'readFile', new ClientError('/x/Y', Status.NOT_FOUND, '/workspace/a: not found'))).toMatchObject({ message: '/workspace/a: not found' });
  });

  it('non-gRPC errors and cancellations pass unchanged', () => {
    const e = new Error('local');
    expect(mapPeerError('podd', 'exec', e)).toBe(e);
    const c = new ClientError('/x/Y', Status.CANCELLED, 'cancelled');
    expect(mapPeerError('podd', 'exec', c)).toBe(c);
  });

  it('withMappedErrors maps unary rejections and stream errors, and keeps results', async () => {
    const fake = {
      ok: async () => 42,
      bad: async () => {
        throw new ClientError('/p/Bad', Status.INTERNAL, STDERR);
      },
      async *stream() {
        yield 1;
        throw new ClientError('/p/Stream', Status.INTERNAL, STDERR);
      },
      value: 7,
    };
    const c = withMappedErrors(fake, 'podd');
    expect(await c.ok()).toBe(42);
    expect(c.value).toBe(7);
    await expect(c.bad()).rejects.toMatchObject({ code: Status.INTERNAL, message: 'podd bad failed (INTERNAL); the server log has the details' });
    const seen: number[] = [];
    await expect(
      (async () => {
        for await (const v of c.stream()) seen.push(v);
      })(),
    ).rejects.toMatchObject({ code: Status.INTERNAL, message: 'podd stream failed (INTERNAL); the server log has the details' });
    expect(seen).toEqual([1]);
  });
});
