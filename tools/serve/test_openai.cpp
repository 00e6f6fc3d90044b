// The OpenAI API surface: every field's accepted and refused values (the refusals generated
// from a table of fields × values of every JSON kind), the chat template, stop strings over a
// stream against a brute force, and the shapes of the bodies the official clients read.
#include "openai.hpp"

#include "attn/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace serve;
using attn::TokenLogprobs;

namespace {

// tiny-shakespeare's 65 characters, in id order
const std::string kChars = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

ServedModel shakespeare() {
    return {"attention-from-scratch", attn::CharVocab::from_chars(kChars), 64, 1700000000};
}

int id_of(char c) { return static_cast<int>(kChars.find(c)); }

// The error a body gets, or a status of 0 when it is accepted.
ApiError refusal(Endpoint endpoint, const std::string& body) {
    const ServedModel m = shakespeare();
    try {
        if (endpoint == Endpoint::chat)
            parse_chat(body, m);
        else
            parse_completions(body, m);
    } catch (const ApiError& e) {
        return e;
    }
    return ApiError(0, "", "accepted");
}

// A body's error names `field` itself or a part of it ("messages[1].content").
bool names(const std::string& param, const std::string& field) {
    return param == field || param.rfind(field + ".", 0) == 0 || param.rfind(field + "[", 0) == 0;
}

}  // namespace

TEST_CASE("an empty completions request takes OpenAI's defaults, and the values clients send by default change nothing") {
    const ServedModel m = shakespeare();
    const Request plain = parse_completions(R"({"prompt": "ROMEO:"})", m);
    const Request neutral = parse_completions(
        R"({"model": "attention-from-scratch", "prompt": "ROMEO:", "n": 1, "top_p": 1, "echo": false,
            "logprobs": null, "stop": null, "presence_penalty": 0, "frequency_penalty": 0, "best_of": 1,
            "suffix": null, "logit_bias": {}, "user": "u", "stream": false, "temperature": 1,
            "max_tokens": 16, "seed": null, "stream_options": null})",
        m);
    for (const Request& r : {plain, neutral}) {
        CHECK(r.prompts == std::vector<std::vector<int>>{{id_of('R'), id_of('O'), id_of('M'), id_of('E'),
                                                          id_of('O'), id_of(':')}});
        CHECK(r.prompt_texts == std::vector<std::string>{"ROMEO:"});
        CHECK(r.options.max_new_tokens == 16);
        CHECK(r.options.temperature == 1.0f);
        CHECK(r.options.top_k == 0);
        CHECK(r.options.top_p == 1.0f);
        CHECK(r.options.presence_penalty == 0.0f);
        CHECK(r.options.frequency_penalty == 0.0f);
        CHECK(r.options.top_logprobs == -1);
        CHECK(r.n == 1);
        CHECK_FALSE(r.stream);
        CHECK_FALSE(r.include_usage);
        CHECK_FALSE(r.echo);
        CHECK(r.stop.empty());
        CHECK_FALSE(r.seeded);
        CHECK(r.model == "attention-from-scratch");
    }
    // an unseeded request draws its own seed: two equal by chance once in 2^64
    CHECK(plain.options.seed != neutral.options.seed);
}

TEST_CASE("every completions field's accepted values reach the request") {
    const ServedModel m = shakespeare();
    const auto parse = [&](const std::string& fields) {
        return parse_completions(R"({"prompt": "ROMEO:", )" + fields + "}", m);
    };
    CHECK(parse(R"("seed": 0)").options.seed == 0);
    CHECK(parse(R"("seed": 9223372036854775808)").options.seed == 9223372036854775808ull);
    CHECK(parse(R"("seed": 18446744073709551615)").options.seed == 18446744073709551615ull);
    CHECK(parse(R"("seed": 7)").seeded);
    CHECK(parse(R"("temperature": 0)").options.top_k == 1);  // greedy
    CHECK(parse(R"("temperature": 0, "top_k": 5)").options.top_k == 1);
    CHECK(parse(R"("temperature": 0.5, "top_k": 5)").options.temperature == 0.5f);
    CHECK(parse(R"("temperature": 0.5, "top_k": 5)").options.top_k == 5);
    CHECK(parse(R"("top_k": -1)").options.top_k == 0);
    CHECK(parse(R"("temperature": 2)").options.temperature == 2.0f);
    CHECK(parse(R"("top_p": 0.25)").options.top_p == 0.25f);
    CHECK(parse(R"("presence_penalty": -2, "frequency_penalty": 2)").options.presence_penalty == -2.0f);
    CHECK(parse(R"("presence_penalty": -2, "frequency_penalty": 2)").options.frequency_penalty == 2.0f);
    CHECK(parse(R"("n": 16)").n == 16);
    CHECK(parse(R"("n": 3, "best_of": 3)").n == 3);
    CHECK(parse(R"("max_tokens": 59)").options.max_new_tokens == 59);  // 6 + 59 − 1 = 64 positions
    CHECK(parse(R"("stop": "\n")").stop == std::vector<std::string>{"\n"});
    CHECK(parse(R"("stop": ["a", "b", "c", "€"])").stop.size() == 4);  // need not be in the vocabulary
    CHECK(parse(R"("echo": true)").echo);
    for (int k = 0; k <= 5; ++k) CHECK(parse(R"("logprobs": )" + std::to_string(k)).options.top_logprobs == k);
    const Request s = parse(R"("stream": true, "stream_options": {"include_usage": true})");
    CHECK(s.stream);
    CHECK(s.include_usage);

    // the four forms of prompt
    const Request many = parse_completions(R"({"prompt": ["ab", "", "c"]})", m);
    CHECK(many.prompts == std::vector<std::vector<int>>{{id_of('a'), id_of('b')}, {id_of('\n')}, {id_of('c')}});
    CHECK(many.prompt_texts == std::vector<std::string>{"ab", "\n", "c"});
    const Request ids = parse_completions(R"({"prompt": [0, 64, 13]})", m);
    CHECK(ids.prompts == std::vector<std::vector<int>>{{0, 64, 13}});
    CHECK(ids.prompt_texts == std::vector<std::string>{"\nzA"});
    const Request lists = parse_completions(R"({"prompt": [[13], [14, 15]], "n": 2})", m);
    CHECK(lists.prompts == std::vector<std::vector<int>>{{13}, {14, 15}});
    CHECK(lists.n == 2);
    // a prompt of the whole context with one new token
    CHECK(parse_completions(R"({"prompt": ")" + std::string(64, 'a') + R"(", "max_tokens": 1})", m).prompts[0].size() == 64);
}

// Each field against one value of every JSON kind: the values a field accepts are listed, and
// every other value must be refused with the field named (status 400; 404 for a model the
// server does not serve).
TEST_CASE("every field refuses the values of the wrong kind, out of range, overflowing or null, naming itself") {
    const std::vector<std::string> values = {"null", "true", "\"x\"", "\"\"", "1.5", "-1", "0", "1",
                                             "100", "1e400", "-1e400", "[]", "{}", "[\"a\"]", "[1]",
                                             "{\"a\": 1}", "18446744073709551616"};
    struct Field {
        const char* name;
        std::set<std::string> accepted;
    };
    // the sampling fields both endpoints take, with the values each accepts
    const std::vector<Field> sampling = {
        {"model", {}},
        {"temperature", {"null", "0", "1", "1.5"}},
        {"top_p", {"null", "1"}},
        {"top_k", {"null", "-1", "0", "1"}},
        {"n", {"null", "1"}},
        {"seed", {"null", "0", "1", "100"}},
        {"stream", {"null", "true"}},
        {"stream_options", {"null"}},  // only with stream
        {"stop", {"null", "\"x\"", "[\"a\"]", "[]"}},
        {"presence_penalty", {"null", "1.5", "-1", "0", "1"}},
        {"frequency_penalty", {"null", "1.5", "-1", "0", "1"}},
        {"user", {"\"x\"", "\"\""}},
        {"no_such_field", {}},
    };
    std::vector<Field> completions = sampling, chat = sampling;
    completions.insert(completions.end(), {
        {"prompt", {"\"x\"", "\"\"", "[\"a\"]", "[1]"}},
        {"max_tokens", {"null", "1"}},
        {"echo", {"null", "true"}},
        {"logprobs", {"null", "0", "1"}},
        {"best_of", {"null", "1"}},
        {"suffix", {"null", "\"\""}},
        {"logit_bias", {"null", "{}"}},
        {"messages", {}},  // chat's
        {"top_logprobs", {}},
        {"max_completion_tokens", {}},
    });
    chat.insert(chat.end(), {
        {"messages", {}},
        {"max_tokens", {"null", "1"}},
        {"max_completion_tokens", {"null", "1"}},
        {"logprobs", {"null", "true"}},
        {"top_logprobs", {"null"}},  // only with logprobs
        {"prompt", {}},
        {"echo", {}},
        {"best_of", {}},
        {"suffix", {}},
    });
    int refused = 0;
    for (const Endpoint endpoint : {Endpoint::completions, Endpoint::chat}) {
        const bool is_chat = endpoint == Endpoint::chat;
        const std::string base = is_chat ? R"("messages": [{"role": "user", "content": "Hi"}])" : R"("prompt": "ROMEO:")";
        const std::string base_field = is_chat ? "messages" : "prompt";
        for (const Field& f : is_chat ? chat : completions) {
            for (const std::string& v : values) {
                const std::string body = f.name == base_field ? "{\"" + base_field + "\": " + v + "}"
                                                              : "{" + base + ", \"" + f.name + "\": " + v + "}";
                CAPTURE(body);
                const ApiError e = refusal(endpoint, body);
                if (f.accepted.count(v)) {
                    CHECK(e.status == 0);
                    CHECK(std::string(e.what()) == "accepted");
                    continue;
                }
                ++refused;
                CHECK(e.status == (std::string(f.name) == "model" && v[0] == '"' ? 404 : 400));
                CHECK(names(e.param, f.name));
                // the message starts with the field, or is the 404's own sentence
                CHECK((std::string(e.what()).rfind(e.param + ": ", 0) == 0 || e.status == 404));
            }
        }
    }
    MESSAGE(refused << " generated bad bodies refused");
}

TEST_CASE("the values out of range are refused on their own field") {
    struct Case {
        Endpoint endpoint;
        std::string body;
        std::string param;
    };
    const Endpoint C = Endpoint::completions, H = Endpoint::chat;
    const std::vector<Case> cases = {
        {C, R"({"prompt": "a", "n": 0})", "n"},
        {C, R"({"prompt": "a", "n": 17})", "n"},
        {C, R"({"prompt": ["a", "b", "c", "d", "e"], "n": 16})", "n"},  // 80 choices
        {C, R"({"prompt": "a", "max_tokens": 0})", "max_tokens"},
        {C, R"({"prompt": "a", "max_tokens": 65})", "max_tokens"},
        {C, R"({"prompt": "ROMEO:", "max_tokens": 60})", "max_tokens"},  // 65 positions
        {C, R"({"prompt": "a", "max_tokens": 1e12})", "max_tokens"},
        {C, R"({"prompt": "a", "temperature": -0.1})", "temperature"},
        {C, R"({"prompt": "a", "temperature": 2.01})", "temperature"},
        {C, R"({"prompt": "a", "temperature": 1e-50})", "temperature"},  // 0 as a float
        {C, R"({"prompt": "a", "top_p": 0})", "top_p"},
        {C, R"({"prompt": "a", "top_p": 1.01})", "top_p"},
        {C, R"({"prompt": "a", "top_p": 1e-50})", "top_p"},
        {C, R"({"prompt": "a", "top_k": -2})", "top_k"},
        {C, R"({"prompt": "a", "top_k": 66})", "top_k"},
        {C, R"({"prompt": "a", "seed": -1})", "seed"},
        {C, R"({"prompt": "a", "seed": 1.0})", "seed"},
        {C, R"({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]})", "stop"},
        {C, R"({"prompt": "a", "stop": ""})", "stop"},
        {C, R"({"prompt": "a", "stop": [1]})", "stop"},
        {C, R"({"prompt": "a", "logprobs": 6})", "logprobs"},
        {C, R"({"prompt": "a", "logprobs": true})", "logprobs"},
        {C, R"({"prompt": "a", "presence_penalty": 2.5})", "presence_penalty"},
        {C, R"({"prompt": "a", "frequency_penalty": -2.01})", "frequency_penalty"},
        {C, R"({"prompt": "a", "best_of": 2})", "best_of"},
        {C, R"({"prompt": "a", "n": 2, "best_of": 3})", "best_of"},
        {C, R"({"prompt": "a", "suffix": "b"})", "suffix"},
        {C, R"({"prompt": "a", "logit_bias": {"13": 5}})", "logit_bias"},
        {C, R"({"prompt": "a", "echo": true, "logprobs": 1})", "echo"},
        {C, R"({"prompt": "a", "stream_options": {"include_usage": true}})", "stream_options"},
        {C, R"({"prompt": "a", "stream": true, "stream_options": {"x": true}})", "stream_options.x"},
        {C, R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": 1}})", "stream_options.include_usage"},
        {C, R"({"prompt": "a", "stream": true, "stream_options": {"include_usage": 1e400}})", "stream_options"},
        {C, R"({"prompt": [65]})", "prompt"},
        {C, R"({"prompt": [-1]})", "prompt"},
        {C, R"({"prompt": [1, "a"]})", "prompt"},
        {C, R"({"prompt": ["a", [1]]})", "prompt"},
        {C, R"({"prompt": [[1], []]})", "prompt[1]"},
        {C, R"({"prompt": ["a", "b€"]})", "prompt[1]"},
        {C, R"({"prompt": "€"})", "prompt"},
        {C, R"({"max_tokens": 3})", "prompt"},
        {C, R"({"prompt": "a", "model": "gpt-4"})", "model"},
        {C, R"({"prompt": "a", "prompt": 5})", "prompt"},  // the last of a repeated key counts
        {H, R"({"messages": [{"role": "bot", "content": "x"}]})", "messages[0].role"},
        {H, R"({"messages": [{"role": "user"}]})", "messages[0].content"},
        {H, R"({"messages": [{"content": "x"}]})", "messages[0].role"},
        {H, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content"},
        {H, R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]})", "messages[0].content[0]"},
        {H, R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b€"}]})", "messages[1].content"},
        {H, R"({"messages": [{"role": "user", "content": "a", "name": "A:B"}]})", "messages[0].name"},
        {H, R"({"messages": [{"role": "user", "content": "a", "tool_calls": []}]})", "messages[0].tool_calls"},
        {H, R"({"messages": [{"role": "user", "content": null}]})", "messages[0].content"},
        {H, R"({"messages": ["hi"]})", "messages[0]"},
        {H, R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 21, "logprobs": true})", "top_logprobs"},
        {H, R"({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2})", "top_logprobs"},
        {H, R"({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 64})", "max_completion_tokens"},
        {H, R"({"messages": [{"role": "user", "content": ")" + std::string(60, 'a') + R"("}]})", "messages"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.body);
        const ApiError e = refusal(c.endpoint, c.body);
        CHECK(e.param == c.param);
        CHECK(e.status == (c.param == "model" ? 404 : 400));
    }
    // the model's 404 is OpenAI's: code model_not_found
    const ApiError missing = refusal(C, R"({"prompt": "a", "model": "gpt-4"})");
    CHECK(missing.code == "model_not_found");
    // a NUL gives a whole message (its code point, not the character that ends a C string)
    const ApiError nul = refusal(C, R"({"prompt": "a\u0000b"})");
    CHECK(std::string(nul.what()) == "prompt: the character U+0000 is not in the model's vocabulary");
    CHECK(std::string(refusal(C, R"({"prompt": "€"})").what()) ==
          "prompt: the character '€' (U+20AC) is not in the model's vocabulary");
    CHECK(std::string(refusal(C, R"({"prompt": "a", "max_tokens": 1e400})").what()) ==
          "max_tokens: the number '1e400' is out of range (beyond ±1.8e308)");
    // the body as a whole
    for (const char* body : {"", "{", "[1]", "null", "\"prompt\"", "{\"prompt\": \"a\",}"}) {
        CAPTURE(body);
        const ApiError e = refusal(C, body);
        CHECK(e.status == 400);
        CHECK(e.param.empty());
    }
}

TEST_CASE("the chat template writes each message in the play's speaker style and ends on the assistant's cue") {
    ServedModel m = shakespeare();
    m.context = 128;  // room for a conversation of four messages
    const Request r = parse_chat(R"({"messages": [
        {"role": "system", "content": "A street in Verona."},
        {"role": "user", "content": "Good morrow!"},
        {"role": "assistant", "content": [{"type": "text", "text": "And to "}, {"type": "text", "text": "you."}]},
        {"role": "user", "name": "ROMEO", "content": "Speak."}],
        "max_completion_tokens": 5, "logprobs": true, "top_logprobs": 3})",
                                 m);
    const std::string want = "A street in Verona.\n\nUSER:\nGood morrow!\n\nASSISTANT:\nAnd to you.\n\nROMEO:\nSpeak.\n\nASSISTANT:\n";
    CHECK(r.prompt_texts == std::vector<std::string>{want});
    CHECK(r.prompts[0].size() == want.size());
    CHECK(r.prompts[0].front() == id_of('A'));
    CHECK(r.options.max_new_tokens == 5);
    CHECK(r.options.top_logprobs == 3);
    CHECK(r.stop == std::vector<std::string>{"\n\n"});  // the end of the assistant's turn
    // absent max_tokens: the rest of the context; a prompt of 21 characters leaves 108 new ones
    const Request rest = parse_chat(R"({"messages": [{"role": "user", "content": "Hi"}], "stop": "x", "logprobs": true})", m);
    CHECK(rest.prompt_texts[0] == "USER:\nHi\n\nASSISTANT:\n");
    CHECK(rest.options.max_new_tokens == 128 - 21 + 1);
    CHECK(rest.options.top_logprobs == 0);
    CHECK(rest.stop == std::vector<std::string>{"x", "\n\n"});
    CHECK(parse_chat(R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 7})", m).options.max_new_tokens == 7);
    // a model whose vocabulary lacks the template's characters refuses chat in one line
    const ServedModel letters{"tiny", attn::CharVocab::from_chars("\n abc"), 64, 0};
    try {
        parse_chat(R"({"messages": [{"role": "user", "content": "abc"}]})", letters);
        FAIL("accepted");
    } catch (const ApiError& e) {
        CHECK(e.param == "messages");
        CHECK(std::string(e.what()).find("'U' (U+0055)") != std::string::npos);
    }
}

namespace {

// The brute force: where the text would be cut if it were read one byte at a time, and the
// longest tail that is the proper start of a stop string.
std::size_t reference_cut(const std::string& text, const std::vector<std::string>& stops, bool& found) {
    for (std::size_t end = 1; end <= text.size(); ++end) {
        std::size_t cut = std::string::npos;
        for (const std::string& s : stops)
            if (s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0) cut = std::min(cut, end - s.size());
        if (cut != std::string::npos) {
            found = true;
            return cut;
        }
    }
    found = false;
    return text.size();
}

std::size_t reference_held(const std::string& text, const std::vector<std::string>& stops) {
    std::size_t held = 0;
    for (const std::string& s : stops)
        for (std::size_t len = 1; len < s.size() && len <= text.size(); ++len)
            if (text.compare(text.size() - len, len, s, 0, len) == 0) held = std::max(held, len);
    return held;
}

}  // namespace

TEST_CASE("a stream never sends text past a stop string, and holds back only what could start one") {
    attn::Rng rng(53);
    const std::string alphabet = "ab\nc";
    int stopped = 0;
    for (int trial = 0; trial < 4000; ++trial) {
        std::vector<std::string> stops(1 + rng.below(4));
        for (std::string& s : stops) {
            s.resize(1 + rng.below(4));
            for (char& c : s) c = alphabet[rng.below(alphabet.size())];
        }
        std::string text(rng.below(30), ' ');
        for (char& c : text) c = alphabet[rng.below(alphabet.size())];
        bool found = false;
        const std::size_t cut = reference_cut(text, stops, found);
        CAPTURE(trial);
        StopScanner scanner(stops);
        std::string sent, fed;
        for (std::size_t at = 0; at < text.size();) {
            const std::size_t len = std::min<std::size_t>(1 + rng.below(3), text.size() - at);  // pieces of 1-3
            fed += text.substr(at, len);
            at += len;
            sent += scanner.push(text.substr(at - len, len));
            CHECK(text.compare(0, sent.size(), sent) == 0);  // what was sent is the text's start
            CHECK(sent.size() <= cut);                      // and never past the stop
            if (scanner.stopped()) break;
            bool found_so_far = false;
            reference_cut(fed, stops, found_so_far);
            REQUIRE_FALSE(found_so_far);
            CHECK(scanner.held().size() == reference_held(fed, stops));  // held back: the minimum
            CHECK(sent + scanner.held() == fed);
        }
        sent += scanner.finish();
        CHECK(scanner.stopped() == found);
        CHECK(sent == text.substr(0, cut));
        stopped += found;
    }
    MESSAGE(stopped << " of 4000 generated streams met a stop string");
    CHECK(stopped > 1000);
    CHECK(stopped < 3900);
}

TEST_CASE("log-probabilities come in OpenAI's completions and chat shapes") {
    const attn::CharVocab vocab = attn::CharVocab::from_chars("ab\né");
    const std::vector<int> tokens = {0, 3};
    const std::vector<TokenLogprobs> lp = {{-0.5, {{0, -0.5}, {1, -1.25}}}, {-2.0, {{1, -0.25}, {3, -2.0}}}};
    const json completion = completion_logprobs(vocab, tokens, lp, 6);
    CHECK(completion == json::parse(R"({"tokens": ["a", "é"], "token_logprobs": [-0.5, -2.0],
        "top_logprobs": [{"a": -0.5, "b": -1.25}, {"b": -0.25, "é": -2.0}], "text_offset": [6, 7]})"));
    const json chat = chat_logprobs(vocab, tokens, lp);
    CHECK(chat == json::parse(R"({"content": [
        {"token": "a", "logprob": -0.5, "bytes": [97], "top_logprobs": [
            {"token": "a", "logprob": -0.5, "bytes": [97]}, {"token": "b", "logprob": -1.25, "bytes": [98]}]},
        {"token": "é", "logprob": -2.0, "bytes": [195, 169], "top_logprobs": [
            {"token": "b", "logprob": -0.25, "bytes": [98]}, {"token": "é", "logprob": -2.0, "bytes": [195, 169]}]}],
        "refusal": null})"));
    CHECK_THROWS_AS(chat_logprobs(vocab, {0}, lp), std::invalid_argument);
}

TEST_CASE("responses, chunks, the usage chunk, models and errors have the shapes the clients read") {
    const ServedModel m = shakespeare();
    Choice c;
    c.index = 1;
    c.text = "ab";
    c.tokens = {id_of('a'), id_of('b')};
    c.finish_reason = "stop";
    const Usage usage{6, 2};
    const json completion = response_body(Endpoint::completions, "cmpl-x", 5, m.name, m.vocab, {c}, usage);
    CHECK(completion == json::parse(R"({"id": "cmpl-x", "object": "text_completion", "created": 5,
        "model": "attention-from-scratch", "choices": [{"index": 1, "text": "ab", "logprobs": null,
        "finish_reason": "stop"}], "usage": {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}})"));
    const json chat = response_body(Endpoint::chat, "chatcmpl-x", 5, m.name, m.vocab, {c}, usage);
    CHECK(chat == json::parse(R"({"id": "chatcmpl-x", "object": "chat.completion", "created": 5,
        "model": "attention-from-scratch", "choices": [{"index": 1, "message": {"role": "assistant",
        "content": "ab", "refusal": null}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}})"));
    c.has_logprobs = true;
    c.logprobs = {{-1.0, {}}, {-2.0, {}}};
    c.text_offset = 6;
    CHECK(response_body(Endpoint::completions, "i", 5, m.name, m.vocab, {c}, usage)["choices"][0]["logprobs"]["text_offset"] ==
          json::array({6, 7}));

    Choice piece;
    piece.text = "a";
    piece.tokens = {id_of('a')};
    CHECK(chunk_body(Endpoint::chat, "chatcmpl-x", 5, m.name, m.vocab, piece, true, "") ==
          json::parse(R"({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 5, "model": "attention-from-scratch",
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}, "logprobs": null, "finish_reason": null}]})"));
    piece.text.clear();
    CHECK(chunk_body(Endpoint::chat, "chatcmpl-x", 5, m.name, m.vocab, piece, false, "length")["choices"][0] ==
          json::parse(R"({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"})"));
    piece.text = "b";
    CHECK(chunk_body(Endpoint::completions, "cmpl-x", 5, m.name, m.vocab, piece, true, "")["choices"][0] ==
          json::parse(R"({"index": 0, "text": "b", "logprobs": null, "finish_reason": null})"));
    CHECK(usage_chunk(Endpoint::chat, "chatcmpl-x", 5, m.name, usage) ==
          json::parse(R"({"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 5, "model": "attention-from-scratch",
            "choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": 2, "total_tokens": 8}})"));
    CHECK(sse(json{{"a", 1}}) == "data: {\"a\":1}\n\n");
    CHECK(sse_done() == "data: [DONE]\n\n");

    CHECK(model_list(m) == json::parse(R"({"object": "list", "data": [{"id": "attention-from-scratch",
        "object": "model", "created": 1700000000, "owned_by": "attention-from-scratch"}]})"));
    CHECK(retrieve_model(m, "attention-from-scratch") == model_list(m)["data"][0]);
    try {
        retrieve_model(m, "gpt-4");
        FAIL("found");
    } catch (const ApiError& e) {
        CHECK(e.status == 404);
        CHECK(error_body(e) == json::parse(R"({"error": {"message": "The model 'gpt-4' does not exist; this server serves 'attention-from-scratch'",
            "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})"));
    }
    CHECK(error_body("queue full", "server_busy", "") ==
          json::parse(R"({"error": {"message": "queue full", "type": "server_busy", "param": null, "code": null}})"));
}

namespace {

// The events of a stream: its JSON chunks, and whether `data: [DONE]` ended it.
std::vector<json> events_of(const std::string& stream, bool& done) {
    std::vector<json> out;
    done = false;
    std::size_t at = 0;
    while (at < stream.size()) {
        const std::size_t end = stream.find("\n\n", at);
        REQUIRE(end != std::string::npos);
        const std::string event = stream.substr(at, end - at);
        REQUIRE(event.rfind("data: ", 0) == 0);
        CHECK_FALSE(done);  // nothing after [DONE]
        if (event == "data: [DONE]")
            done = true;
        else
            out.push_back(json::parse(event.substr(6)));
        at = end + 2;
    }
    return out;
}

}  // namespace

// Requests of both endpoints with random n, prompts, stop strings, echo and logprobs; each
// choice is fed random tokens, the choices interleaved at random, until it ends. What the
// stream sent and what the body says must both equal a brute force over each choice's whole
// text: cut before the first stop string to appear, the tokens of that text and their
// log-probabilities, finish_reason "stop" or "length".
TEST_CASE("a request's stream and its body give each choice's text up to its stop, with its tokens and usage") {
    ServedModel m{"tiny", attn::CharVocab::from_chars("\n :abcéASITNUER"), 40, 0};
    const std::string alphabet[] = {"a", "b", "é", "\n"};
    attn::Rng rng(2053);
    for (int trial = 0; trial < 600; ++trial) {
        CAPTURE(trial);
        const bool chat = rng.below(2) == 1;
        json body = {{"stream", rng.below(4) != 0}, {"max_tokens", 1 + rng.below(12)}, {"n", 1 + rng.below(3)},
                     {"seed", rng.next_u64()}};
        if (body["stream"].get<bool>() && rng.below(2)) body["stream_options"] = {{"include_usage", true}};
        json stops = json::array();
        for (std::uint64_t i = rng.below(3); i > 0; --i) {
            std::string s;
            for (std::uint64_t k = 1 + rng.below(3); k > 0; --k) s += alphabet[rng.below(4)];
            stops.push_back(s);
        }
        if (!stops.empty()) body["stop"] = stops;
        const bool logprobs = rng.below(2) == 1;
        if (chat) {
            body["messages"] = {{{"role", "user"}, {"content", "ab"}}};
            if (logprobs) body["logprobs"] = true, body["top_logprobs"] = 2;
        } else {
            body["prompt"] = rng.below(2) ? json("ab") : json({"a", "cab"});
            if (logprobs) body["logprobs"] = 2;
            else if (rng.below(2)) body["echo"] = true;
        }
        CAPTURE(body.dump());
        const Request r = chat ? parse_chat(body.dump(), m) : parse_completions(body.dump(), m);
        Completion completion(r, m, "id", 1);
        const int choices = completion.choices();
        REQUIRE(choices == static_cast<int>(r.prompts.size()) * r.n);

        // the tokens each choice will produce, and the log-probabilities the scheduler gives
        std::vector<std::vector<int>> produced(static_cast<std::size_t>(choices));
        std::vector<std::vector<TokenLogprobs>> lps(static_cast<std::size_t>(choices));
        for (int c = 0; c < choices; ++c) {
            CHECK(completion.submissions()[static_cast<std::size_t>(c)].prompt == r.prompts[static_cast<std::size_t>(c / r.n)]);
            for (int k = 0; k < r.options.max_new_tokens; ++k) {
                produced[static_cast<std::size_t>(c)].push_back(m.vocab.encode(alphabet[rng.below(4)])[0]);
                lps[static_cast<std::size_t>(c)].push_back({-0.5 * k, {{k % 15, -0.5 * k}}});
            }
        }
        std::string stream;
        std::vector<std::size_t> fed(static_cast<std::size_t>(choices), 0);
        while (!completion.finished()) {
            const int c = static_cast<int>(rng.below(static_cast<std::uint64_t>(choices)));
            std::size_t& k = fed[static_cast<std::size_t>(c)];
            if (completion.finished(c)) continue;  // the server cancels it
            const bool last = k + 1 == produced[static_cast<std::size_t>(c)].size();
            stream += completion.add(c, produced[static_cast<std::size_t>(c)][k],
                                     logprobs ? std::optional<TokenLogprobs>(lps[static_cast<std::size_t>(c)][k]) : std::nullopt,
                                     last);
            ++k;
        }
        stream += r.stream ? completion.stream_end() : "";
        CHECK(stream.empty() == !r.stream);

        // the brute force
        std::vector<std::string> want_text(static_cast<std::size_t>(choices));
        std::vector<std::string> want_reason(static_cast<std::size_t>(choices));
        int generated = 0;
        for (int c = 0; c < choices; ++c) {
            std::string whole;
            for (int t : produced[static_cast<std::size_t>(c)]) whole += m.vocab.at(t);
            bool found = false;
            const std::size_t cut = reference_cut(whole, r.stop, found);
            want_text[static_cast<std::size_t>(c)] = whole.substr(0, cut);
            want_reason[static_cast<std::size_t>(c)] = found ? "stop" : "length";
            generated += static_cast<int>(fed[static_cast<std::size_t>(c)]);
            // fed up to the token that completed the stop, or all of them
            if (!found) CHECK(fed[static_cast<std::size_t>(c)] == produced[static_cast<std::size_t>(c)].size());
        }
        const json whole = completion.body();
        CHECK(whole["object"] == (chat ? "chat.completion" : "text_completion"));
        CHECK(whole["usage"]["completion_tokens"] == generated);
        for (int c = 0; c < choices; ++c) {
            CAPTURE(c);
            const json& choice = whole["choices"][static_cast<std::size_t>(c)];
            const std::string prefix = r.echo ? r.prompt_texts[static_cast<std::size_t>(c / r.n)] : std::string();
            const std::string text = chat ? choice["message"]["content"].get<std::string>() : choice["text"].get<std::string>();
            CHECK(text == prefix + want_text[static_cast<std::size_t>(c)]);
            CHECK(choice["finish_reason"] == want_reason[static_cast<std::size_t>(c)]);
            CHECK(choice["index"] == c);
            const std::size_t characters = attn::utf8_characters(want_text[static_cast<std::size_t>(c)]).size();
            if (logprobs) {
                const json& l = choice["logprobs"];
                const json& entries = chat ? l["content"] : l["token_logprobs"];
                REQUIRE(entries.size() == characters);
                for (std::size_t k = 0; k < characters; ++k) {
                    const double want = lps[static_cast<std::size_t>(c)][k].logprob;
                    CHECK((chat ? entries[k]["logprob"] : entries[k]).get<double>() == want);
                }
            } else {
                CHECK(choice["logprobs"].is_null());
            }
        }
        if (!r.stream) continue;
        bool done = false;
        const std::vector<json> events = events_of(stream, done);
        CHECK(done);
        std::map<int, std::string> texts;
        std::map<int, int> reasons, firsts;
        std::map<int, std::vector<double>> streamed_lps;
        for (const json& e : events) {
            CHECK(e["id"] == "id");
            if (e["choices"].empty()) {  // the usage chunk, last
                CHECK(r.include_usage);
                CHECK(&e == &events.back());
                CHECK(e["usage"] == whole["usage"]);
                continue;
            }
            const json& ch = e["choices"][0];
            const int c = ch["index"].get<int>();
            CHECK(reasons[c] == 0);  // nothing after a choice's finish_reason
            if (chat) {
                if (firsts[c]++ == 0) CHECK(ch["delta"]["role"] == "assistant");
                else CHECK_FALSE(ch["delta"].contains("role"));
                texts[c] += ch["delta"].value("content", "");
            } else {
                texts[c] += ch["text"].get<std::string>();
            }
            if (!ch["logprobs"].is_null())
                for (const json& x : chat ? ch["logprobs"]["content"] : ch["logprobs"]["token_logprobs"])
                    streamed_lps[c].push_back(chat ? x["logprob"].get<double>() : x.get<double>());
            if (!ch["finish_reason"].is_null()) {
                reasons[c] = 1;
                CHECK(ch["finish_reason"] == want_reason[static_cast<std::size_t>(c)]);
            }
        }
        for (int c = 0; c < choices; ++c) {
            CAPTURE(c);
            const std::string prefix = r.echo ? r.prompt_texts[static_cast<std::size_t>(c / r.n)] : std::string();
            CHECK(texts[c] == prefix + want_text[static_cast<std::size_t>(c)]);
            CHECK(reasons[c] == 1);
            if (logprobs) {
                std::vector<double> want;
                for (std::size_t k = 0; k < attn::utf8_characters(want_text[static_cast<std::size_t>(c)]).size(); ++k)
                    want.push_back(lps[static_cast<std::size_t>(c)][k].logprob);
                CHECK(streamed_lps[c] == want);
            }
        }
        CHECK(r.include_usage == (!events.empty() && events.back()["choices"].empty()));
    }
}

TEST_CASE("sample j of a request draws with the request's seed + j") {
    const ServedModel m = shakespeare();
    const Request r = parse_completions(R"({"prompt": ["a", "b"], "n": 3, "seed": 7})", m);
    const Completion c(r, m, "id", 0);
    REQUIRE(c.submissions().size() == 6);
    std::set<std::uint64_t> seeds;
    for (std::size_t i = 0; i < 6; ++i) {
        CHECK(c.submissions()[i].prompt == r.prompts[i / 3]);
        seeds.insert(c.submissions()[i].options.seed);
    }
    CHECK(seeds == std::set<std::uint64_t>{7, 8, 9});  // seed + sample, for each prompt
    CHECK(c.submissions()[4].options.seed == 8);
    // the seed wraps around at 2^64
    const Request top = parse_completions(R"({"prompt": "a", "n": 2, "seed": 18446744073709551615})", m);
    CHECK(Completion(top, m, "id", 0).submissions()[1].options.seed == 0);
}
