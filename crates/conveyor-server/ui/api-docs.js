// The API reference page (/docs): every operation of /openapi.json, grouped by tag, with its
// description, parameters, request body and answers. Text only (textContent), so nothing in
// the document can run as code; the page's CSP allows scripts and styles from this origin only.

const METHODS = ['get', 'put', 'post', 'delete', 'patch'];

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

/** `#/components/schemas/Job` as `Job`. */
function refName(schema) {
  if (!schema) return '';
  if (schema.$ref) return schema.$ref.split('/').pop();
  if (schema.oneOf) return schema.oneOf.map(refName).join(' | ');
  if (schema.type === 'array') return `${refName(schema.items)}[]`;
  if (Array.isArray(schema.type)) return schema.type.join(' | ');
  return schema.type || 'object';
}

function operations(spec) {
  const byTag = new Map();
  for (const [path, item] of Object.entries(spec.paths || {})) {
    for (const method of METHODS) {
      const op = item[method];
      if (!op) continue;
      const tag = (op.tags && op.tags[0]) || 'other';
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push({ path, method, op, shared: item.parameters || [] });
    }
  }
  return byTag;
}

function operationNode({ path, method, op, shared }) {
  const section = el('section', null, 'api-op');
  section.id = op.operationId || `${method}-${path}`;
  const title = el('h3');
  title.append(el('code', method.toUpperCase(), `api-method api-${method}`), ' ', el('code', path));
  section.append(title);
  if (op.summary) section.append(el('p', op.summary, 'api-summary'));
  if (op.description) section.append(el('pre', op.description.trim(), 'api-description'));
  const params = [...shared, ...(op.parameters || [])];
  if (params.length) {
    const list = el('ul', null, 'api-params');
    for (const p of params) {
      const name = p.name || refName(p);
      list.append(el('li', `${name} (${p.in || 'ref'}${p.required ? ', required' : ''})${p.description ? ': ' + p.description : ''}`));
    }
    section.append(el('h4', 'Parameters'), list);
  }
  const body = op.requestBody && op.requestBody.content && op.requestBody.content['application/json'];
  if (body) section.append(el('h4', 'Body'), el('p', refName(body.schema)));
  const answers = el('ul', null, 'api-responses');
  for (const [status, response] of Object.entries(op.responses || {})) {
    const schema = response.content && response.content['application/json'] && response.content['application/json'].schema;
    answers.append(el('li', `${status}: ${response.description || refName(response)}${schema ? ' → ' + refName(schema) : ''}`));
  }
  section.append(el('h4', 'Answers'), answers);
  return section;
}

async function main() {
  const target = document.getElementById('api-operations');
  let spec;
  try {
    const response = await fetch('/openapi.json', { cache: 'no-store' });
    if (!response.ok) throw new Error(`/openapi.json answered ${response.status}`);
    spec = await response.json();
  } catch (error) {
    target.replaceChildren(el('p', `Cannot load the API description: ${error.message}`, 'error'));
    return;
  }
  document.getElementById('api-version').textContent = `API version ${spec.info && spec.info.version}.`;
  const index = document.getElementById('api-index');
  const nodes = [];
  for (const [tag, ops] of operations(spec)) {
    const group = el('section', null, 'api-tag');
    group.append(el('h2', tag));
    const links = el('ul');
    for (const op of ops) {
      group.append(operationNode(op));
      const link = el('a', `${op.method.toUpperCase()} ${op.path}`);
      link.href = `#${op.op.operationId || `${op.method}-${op.path}`}`;
      const item = el('li');
      item.append(link);
      links.append(item);
    }
    const heading = el('h2', tag);
    index.append(heading, links);
    nodes.push(group);
  }
  target.replaceChildren(...nodes);
}

main();
