// tests/server/openai_client.mjs: drives `ember serve` with the official `openai` npm package,
// unmodified (installed by tests/server_openai.sh into .deps/npm-openai). Run as
//   node openai_client.mjs PREFIX BASE_URL API_KEY MODEL_ID REF_CHAT REF_COMPLETION N_PROMPT_CHAT
// where REF_* hold `ember run`'s raw output for the same greedy requests (text plus the newline
// it adds), and N_PROMPT_CHAT is the chat prompt's token count from `ember tokenize --chat`.
// Prints "ok: ..." / "FAIL: ..." lines and "N passed, M failed"; exits 1 on any failure.
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';

const [prefix, baseURL, apiKey, modelId, refChatPath, refCompPath, nPromptChat] = process.argv.slice(2);
const require = createRequire(prefix.replace(/\/?$/, '/'));
const OpenAI = require('openai');

let passed = 0, failed = 0;
function check(what, cond, detail) {
  if (cond) { passed++; console.log(`ok: ${what}`); }
  else { failed++; console.log(`FAIL: ${what}${detail === undefined ? '' : ': ' + JSON.stringify(detail)}`); }
}
// ember run writes raw bytes and a newline after text that lacks one; the server's text has
// invalid UTF-8 as U+FFFD, as Node's decoder does.
const ref = (path) => readFileSync(path).toString('utf8');
const withNl = (s) => (s.length && !s.endsWith('\n') ? s + '\n' : s);

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const messages = [{ role: 'user', content: 'Hello world' }];
const greedy = { max_tokens: 16, temperature: 0 };

async function expectError(what, promise, Cls, status) {
  try {
    await promise;
    check(what, false, 'no error');
  } catch (e) {
    check(what, e instanceof Cls && e.status === status && typeof e.message === 'string', {
      name: e?.constructor?.name, status: e?.status, message: e?.message });
  }
}

async function main() {
  const models = [];
  for await (const m of client.models.list()) models.push(m);
  check('models.list: the served model', models.length === 1 && models[0].id === modelId && models[0].object === 'model', models);

  // chat, not streaming
  const chat = await client.chat.completions.create({ model: modelId, messages, ...greedy });
  const content = chat.choices[0].message.content;
  check('chat: id and object', chat.id.startsWith('chatcmpl-') && chat.object === 'chat.completion', chat.id);
  check('chat: greedy text equals ember run --chat', withNl(content) === ref(refChatPath), { content });
  check('chat: finish_reason', ['stop', 'length'].includes(chat.choices[0].finish_reason), chat.choices[0].finish_reason);
  const u = chat.usage;
  check('chat: usage fields', u.prompt_tokens === Number(nPromptChat) && u.completion_tokens >= 1 &&
        u.completion_tokens <= 16 && u.total_tokens === u.prompt_tokens + u.completion_tokens, u);
  check('chat: llama-server timings', chat.timings && chat.timings.prompt_n === u.prompt_tokens &&
        chat.timings.predicted_n === u.completion_tokens && chat.timings.draft_n === 0, chat.timings);

  // chat, streaming (raw chunks, with usage)
  const stream = await client.chat.completions.create({ model: modelId, messages, ...greedy, stream: true,
                                                        stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, role = null, ids = new Set();
  for await (const chunk of stream) {
    ids.add(chunk.id);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check('chat stream: the deltas spell the non-streaming text', text === content, { text, content });
  check('chat stream: role, finish_reason, one id', role === 'assistant' && finish === chat.choices[0].finish_reason && ids.size === 1);
  check('chat stream: usage chunk equals the non-streaming usage', usage && usage.prompt_tokens === u.prompt_tokens &&
        usage.completion_tokens === u.completion_tokens && usage.total_tokens === u.total_tokens, usage);

  // the SDK's stream helper assembles the chunks into a completion itself
  const helper = client.chat.completions.stream({ model: modelId, messages, ...greedy });
  const final = await helper.finalChatCompletion();
  check('chat stream helper: finalChatCompletion content', final.choices[0].message.content === content,
        final.choices[0].message);

  // completions
  const comp = await client.completions.create({ model: modelId, prompt: 'Hello world', ...greedy });
  check('completions: greedy text equals ember run', withNl(comp.choices[0].text) === ref(refCompPath), comp.choices[0].text);
  check('completions: object, usage', comp.object === 'text_completion' && comp.usage.prompt_tokens > 0 &&
        comp.usage.total_tokens === comp.usage.prompt_tokens + comp.usage.completion_tokens, comp.usage);
  const cs = await client.completions.create({ model: modelId, prompt: 'Hello world', ...greedy, stream: true });
  let ctext = '', cfinish = null;
  for await (const chunk of cs) for (const c of chunk.choices) { ctext += c.text; if (c.finish_reason) cfinish = c.finish_reason; }
  check('completions stream: the chunks spell the text', ctext === comp.choices[0].text && cfinish === comp.choices[0].finish_reason,
        { ctext, cfinish });
  const stopped = await client.completions.create({ model: modelId, prompt: 'Hello world', ...greedy,
                                                    stop: [comp.choices[0].text.slice(3, 5)] });
  check('completions: stop string cuts the text', comp.choices[0].text.startsWith(stopped.choices[0].text) &&
        stopped.choices[0].text.length <= 3 && stopped.choices[0].finish_reason === 'stop', stopped.choices[0]);

  // any model name is served (many clients send a fixed one); responses name the served model
  for (const name of ['gpt-4o-mini', 'default']) {
    const any = await client.chat.completions.create({ model: name, messages, ...greedy });
    check(`chat naming model '${name}': served, the same greedy text, model ${modelId}`,
          any.choices[0].message.content === content && any.model === modelId, { model: any.model, content: any.choices[0].message.content });
  }
  const anyStream = await client.chat.completions.create({ model: 'gpt-4o-mini', messages, ...greedy, stream: true });
  let anyText = '';
  for await (const chunk of anyStream) for (const c of chunk.choices) anyText += c.delta.content ?? '';
  check("chat stream naming model 'gpt-4o-mini': the same text", anyText === content, anyText);
  const anyComp = await client.completions.create({ model: 'davinci-002', prompt: 'Hello world', ...greedy });
  check("completions naming model 'davinci-002': the same greedy text", anyComp.choices[0].text === comp.choices[0].text &&
        anyComp.model === modelId, anyComp.choices[0].text);

  // errors, as the SDK's typed exceptions
  await expectError('n = 2: BadRequestError 400',
                    client.chat.completions.create({ model: modelId, messages, ...greedy, n: 2 }), OpenAI.BadRequestError, 400);
  await expectError('negative max_tokens: BadRequestError 400',
                    client.completions.create({ model: modelId, prompt: 'x', max_tokens: -1 }), OpenAI.BadRequestError, 400);
  await expectError('unknown role: BadRequestError 400',
                    client.chat.completions.create({ model: modelId, messages: [{ role: 'tool', content: 'x', tool_call_id: 'a' }], ...greedy }),
                    OpenAI.BadRequestError, 400);
  const wrong = new OpenAI({ baseURL, apiKey: 'wrong-key', maxRetries: 0, timeout: 10_000 });
  await expectError('wrong API key: AuthenticationError 401', wrong.models.list(), OpenAI.AuthenticationError, 401);
  try {
    await client.chat.completions.create({ model: modelId, messages, ...greedy, n: 3 });
  } catch (e) {
    check('error body: OpenAI shape (message, type, param)', e.error && typeof e.error.message === 'string' &&
          e.error.type === 'invalid_request_error' && e.error.param === 'n', e.error);
  }
  const again = await client.chat.completions.create({ model: modelId, messages, ...greedy });
  check('still serving after the errors', again.choices[0].message.content === content);
}

main().catch((e) => { failed++; console.log(`FAIL: unexpected ${e?.constructor?.name}: ${e?.message}`); })
  .finally(() => {
    console.log(`${passed} passed, ${failed} failed`);
    process.exit(failed ? 1 : 0);
  });
