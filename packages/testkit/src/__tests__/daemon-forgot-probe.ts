// Run by daemon.test.ts in a child jest: starts the fake daemon and never stops it; writes its
// pid to PROBE_PID_FILE. testkit's afterAll must kill it.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { startDaemon } from '../daemon';

it('starts a daemon and forgets it', async () => {
  const sock = path.join(process.env.PROBE_DIR!, 'forgot.sock');
  const d = await startDaemon({ main: path.join(__dirname, 'fake-daemon.cjs'), socket: sock, env: { FAKE_DAEMON_SOCKET: sock } });
  writeFileSync(process.env.PROBE_PID_FILE!, String(d.pid));
});
