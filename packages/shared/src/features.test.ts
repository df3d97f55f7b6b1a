import { Status } from 'nice-grpc-common';
import { FailedPreconditionError } from './errors';
import { hasFeature, requireFeature, UBLK_FEATURES } from './features';

describe('requireFeature', () => {
  const old = { component: 'ublk-manager', version: '0.1.0', features: ['ublk.loop'] };

  it('passes when the peer lists the feature', () => {
    expect(() => requireFeature({ ...old, features: [UBLK_FEATURES.clone] }, UBLK_FEATURES.clone)).not.toThrow();
    expect(hasFeature(old, UBLK_FEATURES.loop)).toBe(true);
  });

  it('is FAILED_PRECONDITION naming the peer, its version and the feature', () => {
    let err: unknown;
    try {
      requireFeature(old, UBLK_FEATURES.clone, 'ForkSandbox');
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(FailedPreconditionError);
    expect((err as FailedPreconditionError).code).toBe(Status.FAILED_PRECONDITION);
    expect((err as Error).message).toBe('ForkSandbox: ublk-manager 0.1.0 lacks feature "ublk.clone"');
  });
});
