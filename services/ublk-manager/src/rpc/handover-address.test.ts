/**
 * HandoverAll's from_address through a real gRPC server (the shared server middleware, the
 * DeviceService handlers on fake devices), on a unix socket: the old slot is a unix socket of
 * this node, so a TCP/DNS target is INVALID_ARGUMENT and never dialled, and a path with no
 * socket is FAILED_PRECONDITION (it was UNAVAILABLE carrying grpc-js's connect error of the
 * other address, which reads like this slot being down and invites retries).
 */
import { rmSync, writeFileSync } from 'node:fs';
import { Status } from 'nice-grpc-common';
import { createLogger, createSandnodeChannel, createServiceClient, createServiceServer, type ServiceServer } from '@sandnode/shared';
import { DeviceServiceDefinition } from '@sandnode/shared/proto/ublk/v1/ublk';
import { expectCode, makeTempDir } from '@sandnode/testkit';
import { setup } from '../core/__tests__/fakes';
import { deviceService } from './device-service';

describe('HandoverAll from_address', () => {
  let dir: string;
  let server: ServiceServer;
  let channel: ReturnType<typeof createSandnodeChannel>;

  beforeAll(async () => {
    dir = makeTempDir('ublk-from');
    const log = createLogger('test', '0', 'silent');
    server = createServiceServer({ info: { component: 'ublk-manager', version: '0', commit: '', features: [] }, log });
    server.add(DeviceServiceDefinition, deviceService(setup().manager, { selfAddress: `unix://${dir}/ublk.sock` }));
    await server.listen([`unix://${dir}/ublk.sock`]);
    channel = createSandnodeChannel(`unix://${dir}/ublk.sock`);
  });
  afterAll(async () => {
    channel.close();
    await server.shutdown(0);
    rmSync(dir, { recursive: true, force: true });
  });

  const handoverAll = (fromAddress: string) =>
    createServiceClient(DeviceServiceDefinition, channel, { retryAttempts: 1, timeoutMs: 5000 }).handoverAll({ fromAddress, deviceIds: [], perDeviceTimeoutMs: 0 });

  const garbage = ['127.0.0.1:1', 'dns:///example.invalid:443', 'unix:relative.sock', 'unix://', 'x'.repeat(5000)];
  it.each(garbage.map((a) => [a.length > 60 ? `${a.slice(0, 8)}... (${a.length} chars)` : a, a]))('%s is INVALID_ARGUMENT (never dialled)', async (_name, addr) => {
    await expectCode(handoverAll(addr), Status.INVALID_ARGUMENT, /^from_address: .* is not "unix:\/\/" and an absolute socket path; nothing changed$/);
  });

  it('a path with no socket (missing, or a plain file) is FAILED_PRECONDITION naming it', async () => {
    await expectCode(handoverAll(`unix://${dir}/missing.sock`), Status.FAILED_PRECONDITION, `no socket at ${dir}/missing.sock`);
    writeFileSync(`${dir}/plain`, '');
    await expectCode(handoverAll(`unix://${dir}/plain`), Status.FAILED_PRECONDITION, `no socket at ${dir}/plain`);
  });
});
