import { NotFoundError } from '@sandnode/shared';
import { templateNotFound } from './sandbox-manager';

const catalog = (names: string[]) => ({ list: async () => names.map((name) => ({ name }) as never) });

describe('templateNotFound: a create naming a template the node lacks', () => {
  it('names the templates there are, so a typo shows, and what a build would make (newcomer)', async () => {
    const e = await templateNotFound(catalog(['py', 'base']), 'bsae');
    expect(e).toBeInstanceOf(NotFoundError);
    expect(e.message).toBe('template "bsae" not found; this node has: base, py (sandnode template build NAME makes one from the base image)');
  });

  it('says none yet on a node without templates, and bounds a long list', async () => {
    expect((await templateNotFound(catalog([]), 'base')).message).toContain('this node has: none yet');
    const many = Array.from({ length: 30 }, (_, i) => `t${String(i).padStart(2, '0')}`);
    const m = (await templateNotFound(catalog(many), 'x')).message;
    expect(m).toContain('t19, … (30 in all: sandnode template list)');
    expect(m).not.toContain('t20');
  });

  it('a catalog that cannot be read still gives the NOT_FOUND', async () => {
    const e = await templateNotFound({ list: () => Promise.reject(new Error('EACCES')) }, 'x');
    expect(e.message).toContain('this node has: none yet');
  });
});
