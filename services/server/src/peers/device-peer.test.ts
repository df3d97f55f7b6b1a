/**
 * DevicePeer.clone against a ublk-manager that is gone: the wait for it ends before the clone's
 * deadline, and the answer says the manager is not reachable (UNAVAILABLE, naming it, its
 * socket and the connect error), not that the clone was too slow (DEADLINE_EXCEEDED, which a
 * fork answers as a freeze window overrun).
 */
import net from 'node:net';
import path from 'node:path';
import { DeadlineExceededError, UnavailableError } from '@sandnode/shared';
import { DeviceServiceDefinition, type DeviceServiceImplementation } from '@sandnode/shared/proto/ublk/v1/ublk';
import { useTempDir } from '@sandnode/testkit';
import { createServer } from 'nice-grpc';
import { DevicePeer } from './device-peer';

describe('DevicePeer.clone', () => {
  const tmp = useTempDir('sandnode-device-peer-');

  it('a ublk-manager that is gone (no socket) is UNAVAILABLE naming ublk-manager and its socket, also when the deadline is shorter than the wait', async () => {
    const sock = path.join(tmp(), 'gone.sock');
    const peer = new DevicePeer(`unix://${sock}`, { timeoutMs: 2000 });
    try {
      const err = await peer.clone('sb-1-upper', 'sb-0-upper', true, 300).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(UnavailableError);
      expect((err as Error).message).toMatch(new RegExp(`^ublk-manager is not reachable \\(connect: ENOENT; for \\d+ ms\\); is it running\\? `));
    } finally {
      peer.channel.close();
    }
  });

  it('a ublk-manager that is there but does not answer in time stays DEADLINE_EXCEEDED', async () => {
    const sock = path.join(tmp(), 'slow.sock');
    const server = createServer();
    let release: (v: unknown) => void = () => undefined;
    const impl: Record<string, unknown> = {};
    for (const name of Object.keys(DeviceServiceDefinition.methods)) impl[name] = async () => ({});
    impl.cloneDevice = () => new Promise((r) => (release = r)); // the call reaches it and hangs
    server.add(DeviceServiceDefinition, impl as unknown as DeviceServiceImplementation);
    await server.listen(`unix://${sock}`);
    const peer = new DevicePeer(`unix://${sock}`, { timeoutMs: 2000 });
    try {
      const err = await peer.clone('sb-1-upper', 'sb-0-upper', true, 300).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(DeadlineExceededError);
    } finally {
      peer.channel.close();
      release({});
      server.forceShutdown();
    }
  });

  it('a socket that accepts but never speaks gRPC: UNAVAILABLE saying so (the call never left)', async () => {
    const sock = path.join(tmp(), 'mute.sock');
    const conns = new Set<net.Socket>();
    const mute = net.createServer((s) => void conns.add(s)); // accepts, never speaks HTTP/2
    await new Promise<void>((r) => mute.listen(sock, r));
    const peer = new DevicePeer(`unix://${sock}`, { timeoutMs: 2000 });
    try {
      const err = await peer.clone('sb-1-upper', 'sb-0-upper', true, 300).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(UnavailableError);
      expect((err as Error).message).toContain(`ublk-manager is not reachable (connect: accepted, but no gRPC answer;`);
    } finally {
      peer.channel.close();
      for (const s of conns) s.destroy();
      await new Promise((r) => mute.close(r));
    }
  });
});
