// Chat templates render exactly the prompt text the models were trained on.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include <nlohmann/json.hpp>

#include "tokenizer_test_support.h"

namespace specula {
namespace {

// SmolLM2-Instruct's template as its GGUF stores it (real newlines inside the Jinja strings).
const std::string kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// A ChatML template with no default system line (Jinja `\n` escapes, as in some JSON configs).
const std::string kBareChatMLTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const std::string kLlama3Template =
    "{{- bos_token }}{% for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}{% endfor %}";

TEST(ChatTemplate, RecognisesEachKindFromItsTemplateText) {
  EXPECT_EQ(ChatTemplate::from_template_text(kSmolLM2Template).kind(), ChatTemplate::Kind::ChatML);
  EXPECT_EQ(ChatTemplate::from_template_text(kBareChatMLTemplate).kind(), ChatTemplate::Kind::ChatML);
  EXPECT_EQ(ChatTemplate::from_template_text(kLlama3Template).kind(), ChatTemplate::Kind::Llama3);
  EXPECT_EQ(ChatTemplate::from_template_text("{{ messages }}").kind(), ChatTemplate::Kind::Plain);
  EXPECT_EQ(ChatTemplate::from_template_text("").kind(), ChatTemplate::Kind::Plain);
}

TEST(ChatTemplate, ChatMLInsertsSmolLMsDefaultSystemLineWhenTheFirstMessageIsNotSystem) {
  const ChatTemplate t = ChatTemplate::from_template_text(kSmolLM2Template);
  EXPECT_EQ(t.render({{"user", "Hi there"}}),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatMLKeepsTheCallersSystemMessage) {
  const ChatTemplate t = ChatTemplate::from_template_text(kSmolLM2Template);
  EXPECT_EQ(t.render({{"system", "Be terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}}),
            "<|im_start|>system\nBe terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatMLWithoutADefaultLineInsertsNothing) {
  const ChatTemplate t = ChatTemplate::from_template_text(kBareChatMLTemplate);
  EXPECT_EQ(t.render({{"user", "Hi"}}), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ChatMLTakesADefaultLineWrittenWithJinjaEscapes) {
  const std::string jinja = "{{ '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}" + kBareChatMLTemplate;
  EXPECT_EQ(ChatTemplate::from_template_text(jinja).render({{"user", "x"}}, false),
            "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, Llama3WrapsEveryTurnInHeadersAndEndsWithTheAssistantHeader) {
  const ChatTemplate t(ChatTemplate::Kind::Llama3);
  EXPECT_EQ(t.render({{"system", "Be brief."}, {"user", "  What is 2+2?\n"}}),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t.render({{"user", "Hi"}}, /*add_generation_prompt=*/false),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplate, AToolsResultIsAToolTurnInChatMLAndAnIpythonTurnInLlama3) {
  const std::vector<ChatMessage> turns{{"user", "Weather?"}, {"assistant", "[{\"name\":\"w\",\"parameters\":{}}]"},
                                       {"tool", "{\"t\":18}"}};
  EXPECT_EQ(ChatTemplate::from_template_text(kBareChatMLTemplate).render(turns, false),
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n[{\"name\":\"w\",\"parameters\":{}}]<|im_end|>\n"
            "<|im_start|>tool\n{\"t\":18}<|im_end|>\n");
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::Llama3).render({turns[2]}, false),
            "<|begin_of_text|><|start_header_id|>ipython<|end_header_id|>\n\n{\"t\":18}<|eot_id|>");
}

TEST(ChatTemplate, PlainJoinsContentsWithNewlines) {
  const ChatTemplate t;
  EXPECT_EQ(t.render({{"system", "one"}, {"user", "two"}, {"assistant", "three"}}), "one\ntwo\nthree");
}

TEST(ChatTemplate, NamesTheTokenThatEndsAnAssistantTurn) {
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::ChatML).end_of_turn(), "<|im_end|>");
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::Llama3).end_of_turn(), "<|eot_id|>");
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::Plain).end_of_turn(), "");
}

TEST(ChatTemplate, RefusesAnEmptyConversation) {
  test::expect_error<std::invalid_argument>([] { ChatTemplate(ChatTemplate::Kind::ChatML).render({}); },
                                            {"no messages"});
}

TEST(ChatTemplate, TheDefaultModelsOwnTemplateRunsAndRendersAsTheBuiltInChatMLFormat) {
  const ChatTemplate jinja = ChatTemplate::from_template_text(kSmolLM2Template);
  ASSERT_TRUE(jinja.runs_jinja()) << jinja.problem();
  const ChatTemplate built_in(ChatTemplate::Kind::ChatML, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const ChatTemplate other_default(ChatTemplate::Kind::ChatML, "You are someone else");
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{"user", "Hi"}},
      {{"system", "Be terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}},
      {{"user", " spaces \n\t and \"quotes\" 日本 "}, {"assistant", ""}, {"tool", "{\"t\": 1}"}},
  };
  for (const auto& c : conversations) {
    for (bool gen : {true, false}) {
      EXPECT_EQ(jinja.render(c, gen), built_in.render(c, gen));
      if (c.front().role != "system") {
        EXPECT_NE(jinja.render(c, gen), other_default.render(c, gen));  // the control
      }
    }
  }
}

TEST(ChatTemplate, ATemplateThatDoesNotParseFallsBackToTheFormatItsMarkersNameAndSaysWhy) {
  const ChatTemplate t = ChatTemplate::from_template_text(
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}");
  EXPECT_FALSE(t.runs_jinja());
  EXPECT_EQ(t.kind(), ChatTemplate::Kind::ChatML);
  EXPECT_NE(t.problem().find("ends before {% else %} or {% endfor %}"), std::string::npos) << t.problem();
  EXPECT_EQ(t.render({{"user", "x"}}), "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ATemplatesOwnRefusalIsAnInvalidArgumentCarryingItsMessage) {
  const ChatTemplate t = ChatTemplate::from_template_text(
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
      "{{ m.content }}{% endfor %}");
  EXPECT_EQ(t.render({{"user", "fine"}}), "fine");
  test::expect_error<std::invalid_argument>([&] { t.render({{"system", "s"}, {"user", "u"}}); },
                                            {"refuses the conversation", "System role not supported"});
}

TEST(ChatTemplate, ATemplateFailingOnAConversationIsAnInvalidArgumentNamingTheLine) {
  const ChatTemplate t = ChatTemplate::from_template_text(
      "{{ bos_token }}\n{% if messages | length > 1 %}{{ messages[1].content.missing.deeper }}{% endif %}ok");
  ASSERT_TRUE(t.runs_jinja()) << t.problem();
  EXPECT_EQ(t.render({{"user", "u"}}), "\nok");
  test::expect_error<std::invalid_argument>([&] { t.render({{"user", "u"}, {"assistant", "a"}}); },
                                            {"fails on the conversation", "line 2"});
}

TEST(ChatTemplate, ATemplateWritesTheModelsBosAndEosTexts) {
  const ChatTemplate t = ChatTemplate::from_template_text("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                                                          SpecialTokens{"<s>", "</s>"});
  EXPECT_EQ(t.render({{"user", "x"}}), "<s>x</s>");
}

TEST(ChatTemplate, TheOptionTakesABuiltInNameAFileOrTheTemplatesText) {
  EXPECT_EQ(ChatTemplate::from_option("llama3").kind(), ChatTemplate::Kind::Llama3);
  EXPECT_FALSE(ChatTemplate::from_option("chatml").runs_jinja());
  const auto dir = test::scratch_dir();
  const auto file = test::write_file(dir / "t.jinja", "{% for m in messages %}[{{ m.role }}]{% endfor %}\n");
  EXPECT_EQ(ChatTemplate::from_option(file.string()).render({{"user", "x"}}), "[user]");
  EXPECT_EQ(ChatTemplate::from_option("{{ messages | length }}").render({{"user", "x"}, {"assistant", "y"}}), "2");
}

TEST(ChatTemplate, TheOptionRefusesWhatItCannotUseNamingIt) {
  test::expect_error<std::invalid_argument>([] { ChatTemplate::from_option("vicuna"); },
                                            {"'vicuna'", "built-in name (chatml, llama3, plain)"});
  test::expect_error<std::invalid_argument>([] { ChatTemplate::from_option("{% if x %}"); }, {"line 1", "ends before"});
  const auto dir = test::scratch_dir();
  const auto empty = test::write_file(dir / "empty.jinja", "");
  test::expect_error<std::invalid_argument>([&] { ChatTemplate::from_option(empty.string()); }, {"is empty"});
}

TEST(ChatTemplate, RefusesAnUnknownRoleNamingIt) {
  test::expect_error<std::invalid_argument>(
      [] { ChatTemplate(ChatTemplate::Kind::Llama3).render({{"user", "a"}, {"wizard", "b"}}); },
      {"message 1", "'wizard'"});
}

TEST(ChatTemplate, ContinuingTheFinalMessageLeavesItOpenInEveryFormat) {
  const std::vector<ChatMessage> prefill = {{"user", "Name a colour."}, {"assistant", "The colour is "}};
  RenderOptions open;
  open.add_generation_prompt = false;
  open.continue_final_message = true;
  // The model's template writes the text as it is: the trailing space stays.
  EXPECT_EQ(ChatTemplate::from_template_text(kBareChatMLTemplate).render(prefill, open),
            "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe colour is ");
  // Llama 3's trims it: cut after the text it wrote.
  EXPECT_EQ(ChatTemplate::from_template_text(kLlama3Template).render(prefill, open),
            "<|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nThe colour is");
  // The built-in formats the same way.
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::ChatML).render(prefill, open),
            "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe colour is ");
  // Without the option the turn is closed, and add_generation_prompt false adds no new one.
  RenderOptions closed;
  closed.add_generation_prompt = false;
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::ChatML).render(prefill, closed),
            "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nThe colour is <|im_end|>\n");
}

TEST(ChatTemplate, ContinuingAFinalMessageThatCannotBeLeftOpenIsOneClearError) {
  const std::vector<ChatMessage> prefill = {{"user", "Hi"}, {"assistant", "hello"}};
  RenderOptions both;
  both.continue_final_message = true;  // with add_generation_prompt left true
  test::expect_error<std::invalid_argument>([&] { ChatTemplate(ChatTemplate::Kind::ChatML).render(prefill, both); },
                                            {"add_generation_prompt false"});
  RenderOptions open;
  open.add_generation_prompt = false;
  open.continue_final_message = true;
  test::expect_error<std::invalid_argument>(
      [&] { ChatTemplate(ChatTemplate::Kind::ChatML).render({{"user", "Hi"}, {"assistant", " \n"}}, open); }, {"text to continue"});
  const ChatTemplate shouting = ChatTemplate::from_option("{% for m in messages %}{{ m.content | upper }}{% endfor %}");
  test::expect_error<std::invalid_argument>([&] { shouting.render(prefill, open); }, {"does not write the last message's text"});
  EXPECT_EQ(shouting.render({{"user", "Hi"}, {"assistant", "OK THEN"}}, open), "HIOK THEN");  // the control: written as it is
}

TEST(ChatTemplate, ChatTemplateKwargsAreVariablesOfTheTemplateButNotOfTheBuiltInFormats) {
  const ChatTemplate t = ChatTemplate::from_option(
      "{{ messages | length }}{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{{ tags | default('') }}");
  const nlohmann::ordered_json off = {{"enable_thinking", false}, {"tags", "x"}}, on = {{"enable_thinking", true}};
  RenderOptions o;
  EXPECT_EQ(t.render({{"user", "a"}}, o), "1");
  o.variables = &off;
  EXPECT_EQ(t.render({{"user", "a"}}, o), "1<think></think>x");
  o.variables = &on;
  EXPECT_EQ(t.render({{"user", "a"}}, o), "1");
  // The conversation's own variables win over a kwarg of the same name.
  const nlohmann::ordered_json messages = {{"messages", nlohmann::ordered_json::array()}};
  o.variables = &messages;
  EXPECT_EQ(t.render({{"user", "a"}, {"assistant", "b"}}, o), "2");
  o.variables = &off;
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::ChatML).render({{"user", "a"}}, o), ChatTemplate(ChatTemplate::Kind::ChatML).render({{"user", "a"}}));
}

}  // namespace
}  // namespace specula
