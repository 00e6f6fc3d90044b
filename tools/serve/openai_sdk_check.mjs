// serve_gpt through the official OpenAI Node SDK, unchanged: models, completions and chat
// completions, streamed and not, with usage, logprobs, stop strings and n, and the errors the
// SDK turns into its exception classes. One line per check; exit 1 if any failed.
//
//   node openai_sdk_check.mjs http://127.0.0.1:PORT/v1
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0, timeout: 60000 });
let failed = 0;
function check(ok, what) {
  console.log(`${ok ? "ok" : "FAIL"}: ${what}`);
  if (!ok) failed += 1;
}
async function refusal(promise) {
  try {
    await promise;
    return null;
  } catch (e) {
    return e;
  }
}
const chars = (s) => Array.from(s).length;

// models
const models = await client.models.list();
const model = models.data[0]?.id;
check(models.data.length === 1 && typeof model === "string", `models.list(): one model, ${model}`);
const retrieved = await client.models.retrieve(model);
check(retrieved.id === model && retrieved.object === "model", "models.retrieve(its id)");
const missing = await refusal(client.models.retrieve("gpt-4"));
check(missing instanceof OpenAI.NotFoundError && missing.code === "model_not_found",
      "models.retrieve('gpt-4'): NotFoundError, code model_not_found");

// completions
const plain = await client.completions.create({ model, prompt: "ROMEO:", max_tokens: 20, seed: 7 });
check(plain.object === "text_completion" && chars(plain.choices[0].text) === 20 &&
        plain.choices[0].finish_reason === "length",
      "completions.create: 20 characters, finish_reason length");
check(plain.usage.prompt_tokens === 6 && plain.usage.completion_tokens === 20 && plain.usage.total_tokens === 26,
      "completions.create: usage 6 + 20 = 26");
const again = await client.completions.create({ model, prompt: "ROMEO:", max_tokens: 20, seed: 7 });
check(again.choices[0].text === plain.choices[0].text, "the same seed gives the same text");
const unseeded = await Promise.all([0, 1, 2].map(() =>
  client.completions.create({ model, prompt: "ROMEO:", max_tokens: 20 })));
check(new Set(unseeded.map((c) => c.choices[0].text)).size > 1, "requests without a seed differ");

const many = await client.completions.create({ model, prompt: ["ROMEO:", "JULIET:"], max_tokens: 12, n: 2,
                                               logprobs: 3, seed: 1 });
check(many.choices.length === 4 && many.choices.map((c) => c.index).join() === "0,1,2,3",
      "two prompts × n 2: four choices, indexed 0-3");
const lp = many.choices[0].logprobs;
check(lp.tokens.length === chars(many.choices[0].text) && lp.token_logprobs.every((x) => x <= 0) &&
        lp.top_logprobs.every((t) => Object.keys(t).length === 3) && lp.text_offset[0] === 6,
      "logprobs 3: a log-probability per character, 3 alternatives each, offsets after the prompt");
const mass = lp.top_logprobs.map((t) => Object.values(t).reduce((a, x) => a + Math.exp(x), 0));
check(mass.every((m) => m <= 1 + 1e-9), "the alternatives' probabilities sum to at most 1");

const stopped = await client.completions.create({ model, prompt: "ROMEO:", max_tokens: 20, seed: 7, stop: ["e"] });
const full = plain;
const cut = full.choices[0].text.indexOf("e");
check(cut < 0 ? stopped.choices[0].finish_reason === "length"
              : stopped.choices[0].text === full.choices[0].text.slice(0, cut) &&
                  stopped.choices[0].finish_reason === "stop",
      "stop ['e']: the text before the first 'e', finish_reason stop");

let streamed = "";
let usage = null;
let chunks = 0;
for await (const chunk of await client.completions.create({ model, prompt: "ROMEO:", max_tokens: 20, seed: 7,
                                                           stream: true, stream_options: { include_usage: true } })) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) streamed += c.text;
}
check(streamed === plain.choices[0].text, "a stream gives the same text as the same request not streamed");
check(usage && usage.completion_tokens === 20 && chunks > 2, "include_usage: a last chunk with the usage");

// chat completions
// the test's model has a context of 32: "USER:\nHi\n\nASSISTANT:\n" leaves room for 12
const messages = [{ role: "user", content: "Hi" }];
const chat = await client.chat.completions.create({ model, messages, max_completion_tokens: 12, seed: 3 });
const reply = chat.choices[0];
check(chat.object === "chat.completion" && reply.message.role === "assistant" &&
        ["stop", "length"].includes(reply.finish_reason) && !reply.message.content.includes("\n\n"),
      `chat.completions.create: an assistant's reply (${reply.finish_reason}) without a blank line`);
let content = "";
let role = null;
let chatUsage = null;
for await (const chunk of await client.chat.completions.create({ model, messages, max_completion_tokens: 12, seed: 3,
                                                                stream: true, stream_options: { include_usage: true } })) {
  if (chunk.usage) chatUsage = chunk.usage;
  for (const c of chunk.choices) {
    role = role ?? c.delta.role;
    content += c.delta.content ?? "";
  }
}
check(role === "assistant" && content === reply.message.content,
      "a streamed chat reply: role assistant first, then the same text");
check(chatUsage && chatUsage.prompt_tokens === chat.usage.prompt_tokens, "chat include_usage");
const withLogprobs = await client.chat.completions.create({ model, messages, max_completion_tokens: 5, seed: 3,
                                                            logprobs: true, top_logprobs: 2 });
const entries = withLogprobs.choices[0].logprobs.content;
check(entries.length > 0 && entries.every((e) => e.top_logprobs.length === 2 && e.logprob <= 0 &&
                                          Buffer.from(e.bytes).toString() === e.token),
      "chat logprobs: token, logprob, bytes and 2 alternatives per character");

// errors
const zero = await refusal(client.completions.create({ model, prompt: "ROMEO:", max_tokens: 0 }));
check(zero instanceof OpenAI.BadRequestError && zero.param === "max_tokens", "max_tokens 0: BadRequestError on max_tokens");
const euro = await refusal(client.chat.completions.create({ model, messages: [{ role: "user", content: "5 €" }] }));
check(euro instanceof OpenAI.BadRequestError && euro.param === "messages[0].content",
      "a character outside the vocabulary: BadRequestError on messages[0].content");
const other = await refusal(client.completions.create({ model: "gpt-4", prompt: "ROMEO:" }));
check(other instanceof OpenAI.NotFoundError && other.code === "model_not_found", "model gpt-4: NotFoundError");

console.log(failed ? `${failed} failed` : "all passed");
process.exit(failed ? 1 : 0);
