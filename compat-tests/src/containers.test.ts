import { runContainerMode } from './containers';

describe('runContainerMode without a Docker engine', () => {
  // PATH without a `docker` CLI: the engine is missing
  const ctx = { builds: {}, order: [], quick: true, workDir: '/nonexistent', log: () => undefined };

  it('fails under CI=true, naming the engine', async () => {
    const s = await runContainerMode(ctx, { CI: 'true', PATH: '/nonexistent' });
    expect(s.result).toBe('fail');
    expect(s.summary).toMatch(/^missing under CI=true: a Docker engine \(apt-get install docker.io; bash deploy\/docker-engine.sh\): no `docker` CLI on PATH/);
  });
  it('is skipped outside CI, naming the engine', async () => {
    const s = await runContainerMode(ctx, { PATH: '/nonexistent' });
    expect(s.result).toBe('skipped');
    expect(s.summary).toMatch(/^skipped: missing: a Docker engine/);
  });
});
