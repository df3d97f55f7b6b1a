/** What the idle tests (idle.it.test.ts, attack-read-token-resume.it.test.ts) look at besides the API: the server's logs. */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';

/** autoResumes counts the server's "auto-resumed" log lines of sandbox id (every server log under runDir/logs). */
export function autoResumes(runDir: string, id: string): number {
  const dir = path.join(runDir, 'logs');
  let n = 0;
  for (const f of readdirSync(dir).filter((x) => x.startsWith('server'))) {
    for (const line of readFileSync(path.join(dir, f), 'utf8').split('\n')) if (line.includes(id) && line.includes('auto-resumed')) n++;
  }
  return n;
}
