/**
 * TemplateService handlers.
 */
import type { SandnodeCallContext } from '@sandnode/shared';
import type { TemplateServiceImplementation } from '@sandnode/shared/proto/server/v1/template';
import type { TemplateCatalog } from '../core/types';
import { templateToPb } from './convert';

export function templateService(t: TemplateCatalog): TemplateServiceImplementation<SandnodeCallContext> {
  return {
    async buildTemplate(req) {
      return { template: templateToPb(await t.build(req.name, req.replace)) };
    },
    async listTemplates() {
      return { templates: (await t.list()).map(templateToPb) };
    },
    async deleteTemplate(req) {
      return { template: templateToPb(await t.delete(req.name)) };
    },
  };
}
